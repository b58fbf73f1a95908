//! placeholder
pub mod backoff;
pub mod cri;
pub mod images;
pub mod labels;
