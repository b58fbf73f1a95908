//! `cargo xtask bench`.

#[derive(clap::Args)]
pub struct StartupArgs {}

pub fn startup(_args: &StartupArgs) -> anyhow::Result<()> {
    Ok(())
}
