//! Keeps TensorFlow's own log noise out of the server's output.
//!
//! TensorFlow 2.21 logs through absl before (and regardless of) its
//! `TF_CPP_MIN_LOG_LEVEL` setting, straight to file descriptor 2. So the server
//! moves its own stderr to a duplicate descriptor, points fd 2 at a pipe, and a
//! thread copies TensorFlow's lines through, dropping INFO and WARNING ones
//! unless asked to keep them. Lines that are not in TensorFlow's log format are
//! always passed through.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};

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

/// Redirects fd 2 through a filter thread. Returns the server's own stderr.
/// With `keep_all`, nothing is filtered and stderr is left alone.
pub fn filter_stderr(keep_all: bool) -> io::Result<File> {
    // SAFETY: plain descriptor calls; every descriptor created is owned below.
    unsafe {
        let own = libc::dup(2);
        if own < 0 {
            return Err(io::Error::last_os_error());
        }
        let own = OwnedFd::from_raw_fd(own);
        if keep_all {
            return Ok(File::from(own));
        }
        let mut fds = [0; 2];
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let (read, write) = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
        if libc::dup2(fds[1], 2) < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(write);
        let mut passthrough = File::from(own.try_clone()?);
        std::thread::Builder::new()
            .name("tf-log-filter".into())
            .spawn(move || {
                let reader = BufReader::new(File::from(read));
                for line in reader.split(b'\n').map_while(Result::ok) {
                    if !is_tensorflow_noise(&String::from_utf8_lossy(&line)) {
                        let _ = passthrough.write_all(&line);
                        let _ = passthrough.write_all(b"\n");
                    }
                }
            })?;
        Ok(File::from(own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
