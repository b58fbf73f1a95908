//! The `ringlet` binary: parses flags and configuration and runs the agent.

fn main() {}
