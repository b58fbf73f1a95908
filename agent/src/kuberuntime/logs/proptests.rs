//! Property tests of the container-log path (issue 14 §3, "Fuzzing"): the CRI log-line parser and
//! the `/containerLogs` query parser return a value or an error for any input and never panic; a
//! well-formed line parses back into the parts it was written from; and a log file of generated
//! messages (split into `P` fragments, some of them before `sinceTime`, perhaps ending in an
//! unfinished message) reads exactly as a plain model of `kubectl logs` says for any `tailLines`,
//! `limitBytes`, `timestamps` and `sinceTime`, with the tail found the same way whatever size the
//! backwards reads have. A fixed number of cases, so they run in every `cargo test`.

use std::fmt::Write as _;

use bytes::Bytes;
use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::Config;

use super::{LogOptions, ends_message, parse_line, read_logs, tail_start};
use crate::io::{IoEngine, ReadFile, block_on};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// The first message's time; later ones follow a second apart.
fn base_time() -> Timestamp {
    "2026-11-22T10:00:00Z".parse().expect("a valid timestamp")
}

/// One message of a generated log: its stream, the fragments its text was split into (all but the
/// last written as `P` lines), and whether its final `F` line was written at all.
#[derive(Clone, Debug)]
struct Message {
    stderr: bool,
    fragments: Vec<String>,
    finished: bool,
}

/// Message text: printable ASCII with spaces (which the parser must keep), never a newline.
fn fragment() -> impl Strategy<Value = String> {
    "[ -~]{0,12}"
}

fn message(finished: bool) -> impl Strategy<Value = Message> {
    (any::<bool>(), prop::collection::vec(fragment(), 1..4)).prop_map(move |(stderr, fragments)| {
        Message {
            stderr,
            fragments,
            finished,
        }
    })
}

/// Up to 30 finished messages, and sometimes an unfinished one at the end of the file.
fn messages() -> impl Strategy<Value = Vec<Message>> {
    (
        prop::collection::vec(message(true), 0..30),
        prop::option::of(message(false)),
    )
        .prop_map(|(mut messages, unfinished)| {
            messages.extend(unfinished);
            messages
        })
}

/// The timestamp of message `index` as written in the file (RFC 3339, nanoseconds, in UTC).
fn stamp(index: usize) -> String {
    let offset = SignedDuration::from_secs(i64::try_from(index).expect("few messages"));
    base_time()
        .checked_add(offset)
        .expect("in range")
        .strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        .to_string()
}

/// The file the runtime would have written for `messages`.
fn log_text(messages: &[Message]) -> String {
    let mut text = String::new();
    for (index, message) in messages.iter().enumerate() {
        let stream = if message.stderr { "stderr" } else { "stdout" };
        let last = message.fragments.len() - 1;
        for (position, fragment) in message.fragments.iter().enumerate() {
            let tag = if position == last && message.finished {
                "F"
            } else {
                "P"
            };
            let _ = writeln!(text, "{} {stream} {tag} {fragment}", stamp(index));
        }
    }
    text
}

/// What `kubectl logs` shows for `messages` with `options`: the tail's complete messages (and an
/// unfinished one at the end, without its newline), those not before `since`, optionally with the
/// first fragment's timestamp, cut at the byte limit.
fn expected_output(messages: &[Message], options: &LogOptions) -> Vec<u8> {
    let finished = messages.iter().filter(|m| m.finished).count();
    let skip = options.tail_lines.map_or(0, |tail| {
        finished.saturating_sub(usize::try_from(tail).unwrap_or(usize::MAX))
    });
    let mut out = Vec::new();
    for (index, message) in messages.iter().enumerate().skip(skip) {
        let time = base_time()
            .checked_add(SignedDuration::from_secs(
                i64::try_from(index).expect("few"),
            ))
            .expect("in range");
        if options.since.is_some_and(|since| time < since) {
            continue;
        }
        if options.timestamps {
            out.extend_from_slice(stamp(index).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(message.fragments.concat().as_bytes());
        if message.finished {
            out.push(b'\n');
        }
    }
    if let Some(limit) = options.limit_bytes {
        out.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    out
}

fn options() -> impl Strategy<Value = LogOptions> {
    (
        prop::option::of(0u64..35),
        prop::option::of(1u64..400),
        any::<bool>(),
        prop::option::of(0i64..35),
    )
        .prop_map(
            |(tail_lines, limit_bytes, timestamps, since_seconds)| LogOptions {
                follow: false,
                previous: false,
                tail_lines,
                limit_bytes,
                timestamps,
                since: since_seconds.map(|seconds| {
                    base_time()
                        .checked_add(SignedDuration::from_secs(seconds))
                        .expect("in range")
                }),
            },
        )
}

/// Reads the whole log at `path` with `options` on the epoll engine.
fn read_whole_log(path: &std::path::Path, options: LogOptions) -> Vec<u8> {
    let read = async {
        let chunks: Vec<std::io::Result<Bytes>> =
            read_logs(path.to_owned(), options, IoEngine::Epoll, || async {
                false
            })
            .collect()
            .await;
        chunks.into_iter().fold(Vec::new(), |mut all, chunk| {
            all.extend_from_slice(&chunk.expect("the log reads"));
            all
        })
    };
    block_on(IoEngine::Epoll, read).expect("the epoll engine starts")
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn any_line_parses_or_is_refused(line in prop::collection::vec(any::<u8>(), 0..120)) {
        let _ = parse_line(&line);
        let _ = ends_message(&line);
    }

    #[test]
    fn any_query_parses_or_is_refused(query in "[a-zA-Z=&%0-9:.+-]{0,80}") {
        let _ = LogOptions::from_query(Some(&query), base_time());
    }

    #[test]
    fn a_written_line_parses_into_its_parts(
        index in 0usize..100_000,
        stderr: bool,
        partial: bool,
        extra_tags in "(:[a-z]{1,3}){0,2}",
        content in "[ -~]{0,40}",
    ) {
        let stream = if stderr { "stderr" } else { "stdout" };
        let tag = if partial { "P" } else { "F" };
        let written_stamp = stamp(index);
        let text = format!("{written_stamp} {stream} {tag}{extra_tags} {content}");
        let line = parse_line(text.as_bytes()).expect("a well-formed line parses");
        prop_assert_eq!(line.stamp, written_stamp.as_bytes());
        prop_assert_eq!(line.partial, partial);
        prop_assert_eq!(line.content, content.as_bytes());
        prop_assert_eq!(ends_message(text.as_bytes()), !partial);
    }

    #[test]
    fn a_query_of_valid_values_parses_into_them(
        tail_lines in prop::option::of(0u64..1_000_000),
        limit_bytes in prop::option::of(1u64..1_000_000),
        timestamps in prop::option::of(any::<bool>()),
        since_seconds in prop::option::of(1i64..1_000_000),
    ) {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("container", "main");
        if let Some(tail) = tail_lines {
            query.append_pair("tailLines", &tail.to_string());
        }
        if let Some(limit) = limit_bytes {
            query.append_pair("limitBytes", &limit.to_string());
        }
        if let Some(timestamps) = timestamps {
            query.append_pair("timestamps", if timestamps { "true" } else { "false" });
        }
        if let Some(seconds) = since_seconds {
            query.append_pair("sinceSeconds", &seconds.to_string());
        }
        let query = query.finish();
        let parsed = LogOptions::from_query(Some(&query), base_time()).expect("valid values parse");
        prop_assert_eq!(parsed.tail_lines, tail_lines);
        prop_assert_eq!(parsed.limit_bytes, limit_bytes);
        prop_assert_eq!(parsed.timestamps, timestamps == Some(true));
        prop_assert_eq!(
            parsed.since,
            since_seconds.map(|s| base_time().checked_sub(SignedDuration::from_secs(s)).expect("in range"))
        );
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_log_file_reads_as_the_model_says(messages in messages(), options in options()) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("0.log");
        std::fs::write(&path, log_text(&messages)).expect("the log is written");
        let expected = expected_output(&messages, &options);
        let got = read_whole_log(&path, options);
        prop_assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&expected));
    }

    #[test]
    fn the_tail_starts_at_the_same_place_whatever_the_read_size(
        messages in messages(),
        tail in 0u64..35,
        chunk in 1usize..200,
    ) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("0.log");
        std::fs::write(&path, log_text(&messages)).expect("the log is written");
        let (small, whole) = block_on(IoEngine::Epoll, async {
            let file = ReadFile::open(&path, IoEngine::Epoll).await.expect("the log opens");
            let small = tail_start(&file, tail, chunk).await.expect("the tail is found");
            let whole = tail_start(&file, tail, usize::MAX).await.expect("the tail is found");
            (small, whole)
        })
        .expect("the epoll engine starts");
        prop_assert_eq!(small, whole);
    }
}
