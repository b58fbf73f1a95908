//! The program every hollow container runs (the `ringlet-hollow-child` binary, a process of about
//! 150 KiB of its own memory). No kubelet counterpart; it stands in for the container's own
//! program.
//!
//! The container's command and args (`command` then `args` of the container config) are read as
//! words, in order:
//!
//! | word | effect |
//! | --- | --- |
//! | `sleep:<ms>` | sleeps that many milliseconds |
//! | `out:<text>` / `err:<text>` | writes `<text>` as one line on stdout / stderr |
//! | `ignore-sigterm` | from now on SIGTERM does not end the process (only SIGKILL does) |
//! | `exit:<code>` | exits at once with `<code>` (0–255) |
//!
//! Any other word is ignored, so a real pod spec (`sleep 3600`, `nginx -g ...`) runs as a process
//! that waits. Without an `exit:` word the process waits after its last word until a signal ends
//! it; a signal's exit code is then 128 + its number, as containerd reports it. A malformed
//! `sleep:` or `exit:` word writes an error line and exits with code 2.
//!
//! Output goes to the container's CRI log file in the CRI format (`<RFC 3339 time> <stream> F
//! <line>`), written by the process itself, one `write` per line on a file opened for appending, so
//! the runtime needs no pipe or copy task per container. The file is opened again for each line, so
//! after the agent rotated the log (renamed it and called `ReopenContainerLog`) the next line lands
//! in the new file.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};

/// The program's name, next to `ringlet-hollow`.
pub const CHILD_PROGRAM: &str = "ringlet-hollow-child";

/// Exit code for a word the child cannot read.
const BAD_WORD_EXIT: i32 = 2;

/// One instruction of the container's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Word {
    Sleep(Duration),
    Out(String),
    Err(String),
    IgnoreSigterm,
    Exit(i32),
    /// A word the child does not know: ignored.
    Other,
}

impl Word {
    /// Reads one word; `Err` names what is wrong with a malformed `sleep:` or `exit:`.
    pub fn parse(word: &str) -> Result<Self, String> {
        if let Some(ms) = word.strip_prefix("sleep:") {
            let ms = ms
                .parse::<u64>()
                .map_err(|_| format!("{word:?}: sleep takes milliseconds"))?;
            return Ok(Self::Sleep(Duration::from_millis(ms)));
        }
        if let Some(code) = word.strip_prefix("exit:") {
            let code = code
                .parse::<u8>()
                .map_err(|_| format!("{word:?}: exit takes a code from 0 to 255"))?;
            return Ok(Self::Exit(i32::from(code)));
        }
        if let Some(text) = word.strip_prefix("out:") {
            return Ok(Self::Out(text.to_owned()));
        }
        if let Some(text) = word.strip_prefix("err:") {
            return Ok(Self::Err(text.to_owned()));
        }
        if word == "ignore-sigterm" {
            return Ok(Self::IgnoreSigterm);
        }
        Ok(Self::Other)
    }
}

/// What the runtime passes to a container's process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChildArgs {
    /// The CRI log file; `None` discards output (no log path in the container config).
    pub log: Option<PathBuf>,
    /// With a terminal, containerd logs both streams as `stdout`.
    pub tty: bool,
    pub words: Vec<String>,
}

impl ChildArgs {
    /// The arguments after the program name: `[--log <path>] [--tty] -- <words>...`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        if let Some(log) = &self.log {
            args.push("--log".into());
            args.push(log.into());
        }
        if self.tty {
            args.push("--tty".into());
        }
        args.push("--".into());
        args.extend(self.words.iter().map(OsString::from));
        args
    }

    /// The inverse of [`ChildArgs::to_args`].
    pub fn from_args(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut parsed = Self::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.to_str() {
                Some("--log") => {
                    let path = args.next().ok_or("--log needs a path")?;
                    parsed.log = Some(PathBuf::from(path));
                }
                Some("--tty") => parsed.tty = true,
                Some("--") => {
                    parsed.words = args
                        .map(|word| word.to_string_lossy().into_owned())
                        .collect();
                    return Ok(parsed);
                }
                _ => return Err(format!("unexpected argument {}", arg.display())),
            }
        }
        Ok(parsed)
    }
}

/// One line of a CRI log file: `<time> <stream> F <text>` (`F`: a full line, not a partial one).
pub fn log_line(time: jiff::Timestamp, stream: &str, text: &str) -> String {
    format!("{time} {stream} F {text}\n")
}

/// Runs the container's words; returns the exit code when a word ends the process, and otherwise
/// waits until a signal ends it.
pub fn run(args: &ChildArgs) -> i32 {
    let log = args.log.as_deref();
    let err_stream = if args.tty { "stdout" } else { "stderr" };
    for word in &args.words {
        match Word::parse(word) {
            Ok(Word::Sleep(duration)) => std::thread::sleep(duration),
            Ok(Word::Out(text)) => write_line(log, "stdout", &text),
            Ok(Word::Err(text)) => write_line(log, err_stream, &text),
            Ok(Word::IgnoreSigterm) => {
                // A blocked signal stays pending and never ends the process, which is what an
                // ignoring handler does; blocking needs no signal handler.
                if let Err(e) = SigSet::from(Signal::SIGTERM).thread_block() {
                    write_line(
                        log,
                        err_stream,
                        &format!("ringlet-hollow: blocking SIGTERM: {e}"),
                    );
                }
            }
            Ok(Word::Exit(code)) => return code,
            Ok(Word::Other) => {}
            Err(message) => {
                write_line(log, err_stream, &format!("ringlet-hollow: {message}"));
                return BAD_WORD_EXIT;
            }
        }
    }
    loop {
        // Only a signal ends the process now; park may wake spuriously, hence the loop.
        std::thread::park();
    }
}

/// Appends one CRI log line. A failed write is dropped, as output a container cannot deliver is:
/// the process goes on.
fn write_line(log: Option<&Path>, stream: &str, text: &str) {
    let Some(log) = log else { return };
    let Ok(mut file) = OpenOptions::new().append(true).create(true).open(log) else {
        return;
    };
    let lines: String = text
        .split('\n')
        .map(|line| log_line(jiff::Timestamp::now(), stream, line))
        .collect();
    // One write for all lines keeps them together; O_APPEND keeps them whole against other writers.
    let _ = file.write_all(lines.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_read_in_their_forms() {
        assert_eq!(
            Word::parse("sleep:250"),
            Ok(Word::Sleep(Duration::from_millis(250)))
        );
        assert_eq!(Word::parse("exit:3"), Ok(Word::Exit(3)));
        assert_eq!(Word::parse("exit:255"), Ok(Word::Exit(255)));
        assert_eq!(Word::parse("out:a b:c"), Ok(Word::Out("a b:c".to_owned())));
        assert_eq!(Word::parse("err:"), Ok(Word::Err(String::new())));
        assert_eq!(Word::parse("ignore-sigterm"), Ok(Word::IgnoreSigterm));
        assert_eq!(Word::parse("sleep"), Ok(Word::Other));
        assert_eq!(Word::parse("3600"), Ok(Word::Other));
        assert!(Word::parse("exit:256").is_err());
        assert!(Word::parse("exit:-1").is_err());
        assert!(Word::parse("sleep:1s").is_err());
    }

    #[test]
    fn child_args_round_trip() {
        let args = ChildArgs {
            log: Some(PathBuf::from("/var/log/pods/x/c/0.log")),
            tty: true,
            words: vec!["--log".to_owned(), "exit:1".to_owned()],
        };
        assert_eq!(ChildArgs::from_args(args.to_args()), Ok(args));
        let bare = ChildArgs::default();
        assert_eq!(ChildArgs::from_args(bare.to_args()), Ok(bare));
        assert!(ChildArgs::from_args([OsString::from("--bogus")]).is_err());
    }

    #[test]
    fn log_lines_have_the_cri_format() {
        let time: jiff::Timestamp = "2024-05-01T10:00:00.5Z".parse().unwrap();
        assert_eq!(
            log_line(time, "stdout", "hello world"),
            "2024-05-01T10:00:00.5Z stdout F hello world\n"
        );
    }

    #[test]
    fn output_words_append_cri_lines_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let args = ChildArgs {
            log: Some(log.clone()),
            tty: false,
            words: ["out:one", "sleep:0", "err:two\nthree", "nginx", "exit:7"]
                .map(str::to_owned)
                .to_vec(),
        };
        assert_eq!(run(&args), 7);
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<(&str, &str)> = text
            .lines()
            .map(|line| {
                let (time, rest) = line.split_once(' ').unwrap();
                time.parse::<jiff::Timestamp>().unwrap();
                (time, rest)
            })
            .collect();
        let rest: Vec<&str> = lines.iter().map(|(_, rest)| *rest).collect();
        assert_eq!(rest, ["stdout F one", "stderr F two", "stderr F three"]);
    }

    #[test]
    fn a_malformed_word_exits_with_an_error_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let args = ChildArgs {
            log: Some(log.clone()),
            tty: true,
            words: vec!["exit:x".to_owned(), "exit:0".to_owned()],
        };
        assert_eq!(run(&args), BAD_WORD_EXIT);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains(" stdout F ringlet-hollow: \"exit:x\""),
            "{text}"
        );
    }
}
