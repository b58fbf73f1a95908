//! The `/logs/` debugging endpoint (the kubelet's `logServer`, an `http.FileServer` over `/var/log`):
//! [`resolve`] maps the request path below `/logs/` to a file to send or a directory to list, and
//! refuses every way out of the root: `..` segments (also percent-encoded), absolute paths, NUL bytes
//! and symlinks that lead outside.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::Stream;
use http::StatusCode;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::io::ReadFile;

/// Why a `/logs/` request cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum NodeLogError {
    #[error("invalid log path {request:?}: {reason}")]
    Invalid {
        request: String,
        reason: &'static str,
    },
    /// Missing, or a symlink leading outside the root: both look the same to the client.
    #[error("log path {request:?} not found")]
    NotFound { request: String },
    #[error("reading log path {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl NodeLogError {
    /// The status the router answers with.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// What a `/logs/` request names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLogTarget {
    /// A regular file to send (the canonical path, inside the root).
    File(PathBuf),
    /// A directory: its entries' names, sorted, directories with a trailing `/`.
    Directory { path: PathBuf, entries: Vec<String> },
}

/// Resolves `request_path` (the request's path below `/logs/`, still percent-encoded) against `root`.
/// Blocking file-system calls: run it on the blocking pool.
pub fn resolve(root: &Path, request_path: &str) -> Result<NodeLogTarget, NodeLogError> {
    let invalid = |reason| NodeLogError::Invalid {
        request: request_path.to_owned(),
        reason,
    };
    let decoded = percent_decode_str(request_path)
        .decode_utf8()
        .map_err(|_| invalid("not UTF-8 once decoded"))?;
    if decoded.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    let mut joined = root.to_path_buf();
    for segment in decoded.split('/') {
        match segment {
            // Empty segments (`//`, a leading `/`) are skipped, so an absolute path stays below the
            // root instead of replacing it in `join`.
            "" | "." => {}
            ".." => return Err(invalid("contains a .. segment")),
            _ => joined.push(segment),
        }
    }
    let not_found = || NodeLogError::NotFound {
        request: request_path.to_owned(),
    };
    let io_error = |path: &Path, source: io::Error| {
        if source.kind() == io::ErrorKind::NotFound {
            not_found()
        } else {
            NodeLogError::Io {
                path: path.to_owned(),
                source,
            }
        }
    };
    let root = root.canonicalize().map_err(|e| io_error(root, e))?;
    let target = joined.canonicalize().map_err(|e| io_error(&joined, e))?;
    if !target.starts_with(&root) {
        tracing::debug!(request = request_path, target = %target.display(), "log path leads outside the log root");
        return Err(not_found());
    }
    let meta = std::fs::metadata(&target).map_err(|e| io_error(&target, e))?;
    if meta.is_dir() {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&target).map_err(|e| io_error(&target, e))? {
            let entry = entry.map_err(|e| io_error(&target, e))?;
            let mut name = entry.file_name().to_string_lossy().into_owned();
            // A symlink to a directory is listed as one, as Go's FileServer does.
            if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
                name.push('/');
            }
            entries.push(name);
        }
        entries.sort_unstable();
        Ok(NodeLogTarget::Directory {
            path: target,
            entries,
        })
    } else if meta.is_file() {
        Ok(NodeLogTarget::File(target))
    } else {
        Err(invalid("names neither a file nor a directory"))
    }
}

/// Bytes read per step when streaming a file.
const READ_CHUNK: usize = 64 * 1024;

/// The contents of an opened file as a body stream, read a piece at a time through the engine the
/// file was opened on: node logs can be far bigger than what should sit in memory.
pub fn file_stream(file: ReadFile) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    futures::stream::unfold(Some((file, 0)), |state| async move {
        let (file, offset) = state?;
        match file.read_at(offset, READ_CHUNK).await {
            Ok(piece) if piece.is_empty() => None,
            Ok(piece) => {
                let next = offset + piece.len() as u64;
                Some((Ok(piece), Some((file, next))))
            }
            Err(error) => Some((Err(error), None)),
        }
    })
}

/// Characters escaped in a link target: everything that is not safe in a relative URL path.
const HREF: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\'')
    .add(b'&')
    .add(b':');

/// An HTML listing of a directory's entries with relative links, like Go's `FileServer`. Relative
/// links only work when the request path ends with `/`: redirect `/logs/dir` to `/logs/dir/` first.
pub fn render_listing(entries: &[String]) -> String {
    let mut html = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in entries {
        let href: String = utf8_percent_encode(name, HREF).collect();
        let _ = writeln!(html, "<a href=\"{href}\">{}</a>", escape_html(name));
    }
    html.push_str("</pre>\n");
    html
}

fn escape_html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&#34;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{IoEngine, block_on};

    /// A root with `a.log`, `sub/b.log`, a secret next to the root, and symlinks in and out.
    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("log");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.log"), "a").unwrap();
        std::fs::write(root.join("sub/b.log"), "b").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(root.join("sub/b.log"), root.join("inside.log")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("escape.log")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        (dir, root)
    }

    #[test]
    fn files_and_directories_inside_the_root_resolve() {
        let (_dir, root) = fixture();
        let canonical = root.canonicalize().unwrap();
        assert_eq!(
            resolve(&root, "a.log").unwrap(),
            NodeLogTarget::File(canonical.join("a.log"))
        );
        assert_eq!(
            resolve(&root, "sub/./b.log").unwrap(),
            NodeLogTarget::File(canonical.join("sub/b.log"))
        );
        assert_eq!(
            resolve(&root, "inside.log").unwrap(),
            NodeLogTarget::File(canonical.join("sub/b.log")),
            "a symlink that stays inside is followed"
        );
        let NodeLogTarget::Directory { entries, .. } = resolve(&root, "").unwrap() else {
            panic!("the root is a directory");
        };
        assert_eq!(
            entries,
            ["a.log", "escape.log", "inside.log", "sub/", "up/"]
        );
        assert!(matches!(
            resolve(&root, "missing.log"),
            Err(NodeLogError::NotFound { .. })
        ));
    }

    #[test]
    fn dot_dot_segments_are_refused() {
        let (_dir, root) = fixture();
        for attack in ["../secret", "sub/../../secret", "sub/..", ".."] {
            let err = resolve(&root, attack).unwrap_err();
            assert!(
                matches!(err, NodeLogError::Invalid { .. }),
                "{attack}: {err}"
            );
            assert_eq!(err.http_status(), StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn encoded_dot_dot_is_refused() {
        let (_dir, root) = fixture();
        for attack in [
            "%2e%2e/secret",
            "%2E%2E%2Fsecret",
            "sub%2f..%2f..%2fsecret",
            ".%2e/secret",
        ] {
            let err = resolve(&root, attack).unwrap_err();
            assert!(
                matches!(err, NodeLogError::Invalid { .. }),
                "{attack}: {err}"
            );
        }
    }

    #[test]
    fn absolute_paths_stay_below_the_root() {
        let (dir, root) = fixture();
        let secret = dir.path().join("secret");
        let attack = secret.to_str().unwrap();
        // `/logs//<abs>`: joined naively this would replace the root.
        assert!(matches!(
            resolve(&root, attack),
            Err(NodeLogError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&root, "%2fetc%2fpasswd"),
            Err(NodeLogError::NotFound { .. })
        ));
    }

    #[test]
    fn symlinks_leading_out_are_not_found() {
        let (_dir, root) = fixture();
        for attack in ["escape.log", "up/secret", "up/log/a.log/../../secret"] {
            let err = resolve(&root, attack).unwrap_err();
            assert_ne!(err.http_status(), StatusCode::OK, "{attack}");
            assert!(
                !matches!(err, NodeLogError::Io { .. }),
                "{attack}: refused, not an I/O error: {err}"
            );
        }
        assert!(matches!(
            resolve(&root, "up/secret"),
            Err(NodeLogError::NotFound { .. })
        ));
    }

    #[test]
    fn nul_bytes_are_refused() {
        let (_dir, root) = fixture();
        assert!(matches!(
            resolve(&root, "a.log%00.txt"),
            Err(NodeLogError::Invalid { .. })
        ));
    }

    #[test]
    fn files_stream_whole_in_pieces_on_both_engines() {
        use futures::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.log");
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        for engine in [IoEngine::Uring, IoEngine::Epoll] {
            let pieces: Vec<Bytes> = block_on(engine, async {
                let file = ReadFile::open(&path, engine).await.unwrap();
                file_stream(file).map(Result::unwrap).collect().await
            })
            .unwrap();
            assert!(pieces.len() > 1, "{engine}: read a piece at a time");
            assert_eq!(pieces.concat(), content, "{engine}");
        }
    }

    #[test]
    fn listings_escape_names() {
        let html = render_listing(&["a b.log".into(), "<x>&\"".into(), "dir/".into()]);
        assert!(html.contains("<a href=\"a%20b.log\">a b.log</a>"), "{html}");
        assert!(
            html.contains("<a href=\"%3Cx%3E%26%22\">&lt;x&gt;&amp;&#34;</a>"),
            "{html}"
        );
        assert!(html.contains("<a href=\"dir/\">dir/</a>"), "{html}");
    }
}
