//! Support shared by the unit tests: a test whose prerequisite this machine lacks (a tool that is not
//! installed, no root) says SKIP with the reason and passes, except under `CI=true`, where a skip
//! would hide that CI stopped testing something, so it fails instead (the rule `tests/` follows too).

/// Says SKIP for `test` with `reason`, or panics when running under `CI=true`. The caller returns
/// after it.
pub(crate) fn skip(test: &str, reason: &str) {
    skip_in(
        test,
        reason,
        std::env::var("CI").is_ok_and(|ci| ci == "true"),
    );
}

fn skip_in(test: &str, reason: &str, in_ci: bool) {
    assert!(!in_ci, "{test}: cannot run in CI: {reason}");
    eprintln!("SKIP {test}: {reason}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "some_test: cannot run in CI: tool is not installed")]
    fn a_skip_fails_in_ci() {
        skip_in("some_test", "tool is not installed", true);
    }

    #[test]
    fn a_skip_passes_elsewhere() {
        skip_in("some_test", "tool is not installed", false);
    }
}
