//! Keeps TensorFlow's own log noise out of the server's output.
//!
//! TensorFlow 2.21 logs through absl regardless of its `TF_CPP_MIN_LOG_LEVEL`
//! setting, straight to file descriptor 2, and it already logs while its
//! libraries load, before `main`. So the binary registers [`early_redirect`] in
//! `.preinit_array` (run before any shared library's initialisers): it keeps the
//! real stderr on a duplicate descriptor and points fd 2 at a pipe, whose small
//! buffer holds what TensorFlow prints at load. In `main`, [`filter_stderr`]
//! starts a thread that copies the pipe to the real stderr, dropping
//! TensorFlow's INFO and WARNING lines. Lines not in TensorFlow's log format
//! always pass. With `-v` (or SALUS_VERBOSE) nothing is redirected.

use std::ffi::{c_char, c_int, CStr};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// Read end of the pipe fd 2 points at, and the real stderr, once
/// [`early_redirect`] ran; -1 otherwise.
static EARLY_PIPE: AtomicI32 = AtomicI32::new(-1);
static REAL_STDERR: AtomicI32 = AtomicI32::new(-1);

/// The value of `name` in a NULL-terminated `envp` array. In `.preinit_array`
/// libc's `environ` is not set yet (`getenv` finds nothing), so the loader's
/// `envp` is the only view of the environment.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn env_value<'a>(envp: *const *const c_char, name: &[u8]) -> Option<&'a [u8]> {
    if envp.is_null() {
        return None;
    }
    let mut entry = envp;
    while !(*entry).is_null() {
        let bytes = CStr::from_ptr(*entry).to_bytes();
        if let Some(value) = bytes
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(b"="))
        {
            return Some(value);
        }
        entry = entry.add(1);
    }
    None
}

/// Whether the command line or environment asks for TensorFlow's logs.
///
/// # Safety
/// `argv` holds `argc` NUL-terminated strings and `envp` is null or a
/// NULL-terminated array of them, as the loader passes them.
unsafe fn verbose_requested(
    argc: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> bool {
    if env_value(envp, b"SALUS_VERBOSE").is_some_and(|v| !v.is_empty() && v != b"0") {
        return true;
    }
    (1..argc.max(0) as usize).any(|i| {
        let arg = CStr::from_ptr(*argv.add(i)).to_bytes();
        arg == b"--verbose"
            || (arg.len() >= 2
                && arg[0] == b'-'
                && arg[1] == b'v'
                && arg[1..].iter().all(|&c| c == b'v'))
    })
}

/// Runs from `.preinit_array`, before TensorFlow's libraries initialise: sends
/// fd 2 into a pipe unless verbose output was asked for. Only plain descriptor
/// syscalls; on any failure stderr is left as it is.
///
/// # Safety
/// Called by the dynamic loader with the process's argc/argv/envp.
pub unsafe extern "C" fn early_redirect(
    argc: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) {
    if argv.is_null() || verbose_requested(argc, argv, envp) {
        return;
    }
    // A tenant's executor writes straight into the pipe its supervisor reads
    // (and filters): a filter thread here would lose the last words of an
    // abort, which explain the executor's death.
    if env_value(envp, b"SALUS_EXECUTOR_TENANT").is_some() {
        return;
    }
    let real = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
    if real < 0 {
        return;
    }
    let mut fds = [0; 2];
    if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
        libc::close(real);
        return;
    }
    if libc::dup2(fds[1], 2) < 0 {
        libc::close(fds[0]);
        libc::close(fds[1]);
        libc::close(real);
        return;
    }
    libc::close(fds[1]);
    EARLY_PIPE.store(fds[0], Ordering::SeqCst);
    REAL_STDERR.store(real, Ordering::SeqCst);
}

/// Puts the real stderr back on fd 2 and drops the early redirect's pipe
/// (what TensorFlow logged while loading is dropped with it): before this
/// process execs another binary, which must not inherit a pipe nobody reads.
pub fn undo_early_redirect() {
    let pipe = EARLY_PIPE.swap(-1, Ordering::SeqCst);
    let real = REAL_STDERR.swap(-1, Ordering::SeqCst);
    if pipe < 0 || real < 0 {
        return;
    }
    // SAFETY: both descriptors were created by early_redirect and are owned
    // here (swapped out above, so only once).
    unsafe {
        libc::dup2(real, 2);
        libc::close(real);
        libc::close(pipe);
    }
}

/// Whether a line is a TensorFlow/absl log line of INFO or WARNING severity, or
/// absl's notice about logging before initialisation.
pub fn is_tensorflow_noise(line: &str) -> bool {
    if line.starts_with("WARNING: All log messages before absl::InitializeLog()") {
        return true;
    }
    // glog/absl prefix: severity letter, MMDD, space, time ("I0000 00:00:17...").
    let bytes = line.as_bytes();
    bytes.len() > 6
        && matches!(bytes[0], b'I' | b'W')
        && bytes[1..5].iter().all(u8::is_ascii_digit)
        && bytes[5] == b' '
        // CPU feature notice continuation line printed without a prefix.
        || line.starts_with("To enable the following instructions:")
}

/// Starts copying the redirected fd 2 to the real stderr, without TensorFlow's
/// INFO/WARNING lines, and returns the real stderr for the server's own logs.
/// When nothing was redirected (verbose, or no early redirect), returns a
/// duplicate of fd 2 and filters nothing.
pub fn filter_stderr() -> io::Result<File> {
    let pipe = EARLY_PIPE.swap(-1, Ordering::SeqCst);
    let real = REAL_STDERR.load(Ordering::SeqCst);
    if pipe < 0 || real < 0 {
        // SAFETY: dup of a descriptor this process owns; the result is owned below.
        let own = unsafe { libc::dup(2) };
        if own < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `own` is a fresh descriptor owned by nobody else.
        return Ok(File::from(unsafe { OwnedFd::from_raw_fd(own) }));
    }
    // SAFETY: both descriptors were created by early_redirect and are owned here
    // from now on (the pipe: swapped out above, so only once).
    let (read, real) = unsafe { (OwnedFd::from_raw_fd(pipe), OwnedFd::from_raw_fd(real)) };
    let mut passthrough = File::from(real.try_clone()?);
    std::thread::Builder::new()
        .name("tf-log-filter".into())
        .spawn(move || {
            let reader = BufReader::new(File::from(read));
            for line in reader.split(b'\n').map_while(Result::ok) {
                let text = String::from_utf8_lossy(&line);
                if is_tensorflow_noise(&text) {
                    continue;
                }
                if crate::log_json::enabled() {
                    let _ = passthrough
                        .write_all(crate::log_json::relayed(&text, "source", "stderr").as_bytes());
                } else {
                    let _ = passthrough.write_all(&line);
                }
                let _ = passthrough.write_all(b"\n");
            }
        })?;
    Ok(File::from(real))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_variable_in_the_loaders_environment() {
        let entries = [
            c"SALUS_EXECUTOR_TENANT_KEY=uid:0",
            c"SALUS_VERBOSE=",
            c"SALUS_EXECUTOR_TENANT=alice",
        ];
        let mut envp: Vec<*const c_char> = entries.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        // SAFETY: a NULL-terminated array of C strings that outlive the calls.
        unsafe {
            let envp = envp.as_ptr();
            assert_eq!(
                env_value(envp, b"SALUS_EXECUTOR_TENANT"),
                Some(&b"alice"[..])
            );
            assert_eq!(env_value(envp, b"SALUS_VERBOSE"), Some(&b""[..]));
            assert_eq!(env_value(envp, b"SALUS_EXECUTOR"), None);
            assert_eq!(env_value(std::ptr::null(), b"SALUS_VERBOSE"), None);
            let argv = [c"salus-server".as_ptr(), std::ptr::null()];
            assert!(!verbose_requested(1, argv.as_ptr(), envp));
        }
    }

    #[test]
    fn recognises_tensorflow_noise() {
        for noise in [
            "I0000 00:00:1795945830.877819    9174 port.cc:153] oneDNN custom operations are on.",
            "W0000 00:00:1795945830.877819    9174 cpu_feature_guard.cc:227] something",
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
            "To enable the following instructions: AVX2 FMA, in other operations, rebuild",
        ] {
            assert!(is_tensorflow_noise(noise), "{noise}");
        }
        for kept in [
            "E0000 00:00:1795945830.877819    9174 foo.cc:1] real error",
            "F0000 00:00:1795945830.877819    9174 foo.cc:1] fatal",
            "2026-11-29T09:50:30Z INFO salus_server: serving",
            "I",
            "",
        ] {
            assert!(!is_tensorflow_noise(kept), "{kept}");
        }
    }
}
