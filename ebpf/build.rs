//! Compiles every `src/*.bpf.c` with clang (`-target bpf -O2 -g`: BTF and CO-RE relocations are
//! what let one object run on every kernel with BTF) into `$OUT_DIR/<name>.bpf.o`, and reads the
//! layout clang gives `struct ringlet_event` into `$OUT_DIR/c_abi.rs`, against which `src/lib.rs`
//! checks its Rust mirror at compile time.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's libbpf-dev puts `bpf/bpf_helpers.h`.
const LIBBPF_HEADER: &str = "/usr/include/bpf/bpf_helpers.h";

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by exiting non-zero; the message is what cargo shows.
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let src = manifest_dir.join("src");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-env-changed=CLANG");

    let include = env::var("LIBBPF_INCLUDE").unwrap_or_else(|_| "/usr/include".to_owned());
    println!("cargo:rerun-if-env-changed=LIBBPF_INCLUDE");
    let helpers = Path::new(&include).join("bpf/bpf_helpers.h");
    if !helpers.exists() {
        return Err(format!(
            "the libbpf headers are missing ({} not found; expected {LIBBPF_HEADER}): install the \
             Debian packages `clang libbpf-dev`, or point LIBBPF_INCLUDE at their include directory",
            helpers.display()
        ));
    }

    let mut sources = Vec::new();
    for entry in fs::read_dir(&src).map_err(|e| format!("reading {}: {e}", src.display()))? {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", src.display()))?
            .path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".bpf.c") {
            sources.push(path);
        } else if path.extension().is_some_and(|e| e == "h") {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    sources.sort();

    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".c"))
            .ok_or_else(|| format!("odd source name {}", source.display()))?;
        let object = out_dir.join(format!("{stem}.o"));
        let output = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg(format!("-I{}", src.display()))
            .arg(format!("-I{include}"))
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .output()
            .map_err(|e| {
                format!(
                    "running `{clang}` to compile {}: {e}; install the Debian packages \
                     `clang libbpf-dev` (or set CLANG to a clang that targets bpf)",
                    source.display()
                )
            })?;
        if !output.status.success() {
            return Err(format!(
                "clang failed to compile {}:\n{}",
                source.display(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    write_c_abi(&clang, &src, &out_dir)
}

/// The numbers of the ABI as clang sees them for the BPF target: (Rust constant, C expression).
const ABI_VALUES: [(&str, &str); 14] = [
    ("SIZE", "sizeof(struct ringlet_event)"),
    (
        "OFFSET_KIND",
        "__builtin_offsetof(struct ringlet_event, kind)",
    ),
    (
        "OFFSET_TGID",
        "__builtin_offsetof(struct ringlet_event, tgid)",
    ),
    (
        "OFFSET_CGROUP_ID",
        "__builtin_offsetof(struct ringlet_event, cgroup_id)",
    ),
    (
        "OFFSET_KTIME_NS",
        "__builtin_offsetof(struct ringlet_event, ktime_ns)",
    ),
    (
        "OFFSET_PID",
        "__builtin_offsetof(struct ringlet_event, pid)",
    ),
    (
        "OFFSET_EXIT_STATUS",
        "__builtin_offsetof(struct ringlet_event, exit_status)",
    ),
    (
        "OFFSET_PATH",
        "__builtin_offsetof(struct ringlet_event, path)",
    ),
    ("PATH_LEN", "RINGLET_PATH_LEN"),
    ("EVENT_CGROUP_MKDIR", "RINGLET_EVENT_CGROUP_MKDIR"),
    ("EVENT_CGROUP_RMDIR", "RINGLET_EVENT_CGROUP_RMDIR"),
    ("EVENT_EXEC", "RINGLET_EVENT_EXEC"),
    ("EVENT_EXIT", "RINGLET_EVENT_EXIT"),
    ("EVENT_OOM_VICTIM", "RINGLET_EVENT_OOM_VICTIM"),
];

/// Has clang evaluate [`ABI_VALUES`] on `ringlet_event.h` (as constants in LLVM IR, so nothing is run)
/// and writes them as Rust constants to `$OUT_DIR/c_abi.rs`.
fn write_c_abi(clang: &str, src: &Path, out_dir: &Path) -> Result<(), String> {
    let probe = out_dir.join("c_abi.c");
    let mut c = String::from(
        "typedef unsigned int __u32;\ntypedef unsigned long long __u64;\n\
         #include \"ringlet_event.h\"\n",
    );
    for (name, expression) in ABI_VALUES {
        let _ = writeln!(
            c,
            "const unsigned long long ringlet_abi_{name} = {expression};"
        );
    }
    fs::write(&probe, c).map_err(|e| format!("writing {}: {e}", probe.display()))?;
    let output = Command::new(clang)
        .args(["-target", "bpf", "-S", "-emit-llvm", "-o", "-"])
        .arg(format!("-I{}", src.display()))
        .arg(&probe)
        .output()
        .map_err(|e| format!("running `{clang}` on {}: {e}", probe.display()))?;
    if !output.status.success() {
        return Err(format!(
            "clang failed to read the ABI of ringlet_event.h:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let ir = String::from_utf8_lossy(&output.stdout);
    let mut rust = String::from(
        "// Generated by build.rs from ringlet_event.h: the layout clang gives it for the BPF target.\n",
    );
    for (name, _) in ABI_VALUES {
        let value = abi_value(&ir, name)
            .ok_or_else(|| format!("no constant ringlet_abi_{name} in clang's IR:\n{ir}"))?;
        let _ = writeln!(rust, "pub const {name}: usize = {value};");
    }
    let generated = out_dir.join("c_abi.rs");
    fs::write(&generated, rust).map_err(|e| format!("writing {}: {e}", generated.display()))
}

/// The value of `@ringlet_abi_<name> = ... constant i64 <value>, ...` in clang's IR.
fn abi_value(ir: &str, name: &str) -> Option<u64> {
    let global = format!("@ringlet_abi_{name} = ");
    let line = ir.lines().find(|line| line.starts_with(&global))?;
    let (_, after) = line.split_once(" constant i64 ")?;
    after.split(',').next()?.trim().parse().ok()
}
