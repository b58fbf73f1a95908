//! One-line rendering of an error and its causes, for log lines and event messages where the
//! `#[source]` chain would otherwise be lost.

/// The error and its causes, joined by `: `.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(current) = cause {
        text.push_str(": ");
        text.push_str(&current.to_string());
        cause = current.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading manifest x.yaml")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error() {
        let err = Outer(std::io::Error::other("permission denied"));
        assert_eq!(
            error_chain(&err),
            "reading manifest x.yaml: permission denied"
        );
    }
}
