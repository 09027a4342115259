//! How a new supervisor finds and adopts the executors its predecessor left
//! running: the rendezvous.
//!
//! At an executor's start the supervisor binds a Unix socket in the state
//! directory (`executors/<serial>.sock`, in a directory only the server's user
//! can enter), gives the executor the listening end (fd 6) and a secret, and
//! keeps a record beside it (`<serial>.json`, mode 0600: the executor's pid,
//! uid, tenant, job ids and secret). The executor accepts on it only while it
//! has no supervisor, and only from the server's user (`SO_PEERCRED`). A new
//! supervisor connects to each record's socket, checks that the peer is the
//! recorded process running as its tenant's uid and that it knows the secret,
//! and passes it new sockets for relayed calls, handed-over connections and
//! its log (`SCM_RIGHTS`); the same connection then carries the seam.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::seam::handover::message_header;

/// The folder of the rendezvous in the state directory.
pub const DIR: &str = "executors";

/// What the supervisor that started an executor leaves for its successor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutorRecord {
    pub serial: u64,
    pub pid: u32,
    /// The uid the executor runs as.
    pub uid: u32,
    /// `uid:N`, `name:NAME` or `anonymous` (as `SALUS_EXECUTOR_TENANT_KEY`).
    pub tenant_key: String,
    pub tenant_name: String,
    pub secret: String,
    /// The release of the binary it runs.
    pub release: String,
}

impl ExecutorRecord {
    pub fn socket_path(dir: &Path, serial: u64) -> PathBuf {
        dir.join(format!("{serial}.sock"))
    }

    pub fn record_path(dir: &Path, serial: u64) -> PathBuf {
        dir.join(format!("{serial}.json"))
    }

    /// Writes the record (mode 0600, whole or not at all).
    pub fn save(&self, dir: &Path) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        crate::state_dir::write_private(&Self::record_path(dir, self.serial), &text)
    }

    /// Every record in `dir` (unreadable ones are removed, with their socket).
    pub fn list(dir: &Path) -> Vec<ExecutorRecord> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<ExecutorRecord>(&bytes).ok())
            {
                Some(record) => records.push(record),
                None => {
                    tracing::warn!(path = %path.display(), "an unreadable executor record: removed");
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_file(path.with_extension("sock"));
                }
            }
        }
        records.sort_by_key(|r| r.serial);
        records
    }

    /// Removes the record and its socket.
    pub fn remove(dir: &Path, serial: u64) {
        let _ = std::fs::remove_file(Self::record_path(dir, serial));
        let _ = std::fs::remove_file(Self::socket_path(dir, serial));
    }
}

/// Runs `f` with a name of `path` short enough for a Unix socket address
/// (108 bytes): `path` itself, or, for a deep state directory, the same file
/// reached through an open fd of its folder (`/proc/self/fd/N/NAME`).
pub fn with_short_path<T>(path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().len() < 100 {
        return f(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return f(path);
    };
    let dir = std::fs::File::open(dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    f(&short)
}

/// A Unix stream socket bound to `path`, not listening (close-on-exec).
pub fn bound_socket(path: &Path) -> io::Result<OwnedFd> {
    with_short_path(path, bind_at)
}

/// Connects to the Unix socket at `path` (any depth).
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    with_short_path(path, |p| UnixStream::connect(p))
}

fn bind_at(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket path is too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: bind with a valid address of the length given.
    if unsafe {
        libc::bind(
            fd,
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// Listens on a socket bound by [`bound_socket`] (in the process that will accept).
pub fn listen(socket: OwnedFd) -> io::Result<std::os::unix::net::UnixListener> {
    // SAFETY: listen on a socket this process owns.
    if unsafe { libc::listen(socket.as_raw_fd(), 16) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::os::unix::net::UnixListener::from(socket))
}

/// A fresh secret: 32 random bytes, hex.
pub fn new_secret() -> io::Result<String> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the rest of the buffer.
        let n = unsafe {
            libc::getrandom(
                bytes[filled..].as_mut_ptr() as *mut libc::c_void,
                bytes.len() - filled,
                0,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
            continue;
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

/// The process at the other end of a Unix socket: (pid, uid).
pub fn peer(stream: &UnixStream) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt with a valid out-parameter of the size given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid as u32, cred.uid))
}

/// The sockets an adopted executor gets, in this order.
pub const ADOPTION_FDS: usize = 3;

/// Sends `fds` with one byte (blocking).
pub fn send_fds(stream: &UnixStream, fds: &[RawFd]) -> io::Result<()> {
    let byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure size computation.
    let mut control = vec![0u8; unsafe { libc::CMSG_SPACE(payload as u32) } as usize];
    let header = message_header(&mut iov, &mut control);
    // SAFETY: the control buffer holds one cmsg with room for `fds`.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&header);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
    }
    loop {
        // SAFETY: a valid msghdr for a socket we own.
        let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &header, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives exactly `count` fds sent with [`send_fds`] (blocking).
pub fn recv_fds(stream: &UnixStream, count: usize) -> io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let payload = count * std::mem::size_of::<RawFd>();
    // SAFETY: as in send_fds.
    let mut control = vec![0u8; unsafe { libc::CMSG_SPACE(payload as u32) } as usize];
    let mut header = message_header(&mut iov, &mut control);
    let received = loop {
        // SAFETY: a valid msghdr; MSG_CMSG_CLOEXEC keeps the fds from children.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let n = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
    }
    if received == 0 || fds.len() != count || header.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected {count} sockets, got {}", fds.len()),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_rendezvous_in_a_deep_folder_is_bound_and_reached() {
        let dir = crate::state_dir::temp_dir("deep")
            .join("x".repeat(60))
            .join("y".repeat(60));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("7.sock");
        assert!(path.as_os_str().len() > 108);
        let listener = listen(bound_socket(&path).unwrap()).unwrap();
        assert!(path.exists());
        let _client = connect(&path).unwrap();
        listener.accept().unwrap();
        let _ = std::fs::remove_dir_all(dir.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn the_peer_of_a_rendezvous_is_the_process_that_listens() {
        let dir = crate::state_dir::temp_dir("rendezvous");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("1.sock");
        let socket = bound_socket(&path).unwrap();
        // Not listening yet: nobody can connect.
        assert!(UnixStream::connect(&path).is_err());
        let listener = listen(socket).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        assert_eq!(peer(&client).unwrap().0, std::process::id());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sockets_cross_with_their_peer_known() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut x, y) = UnixStream::pair().unwrap();
        send_fds(&a, &[y.as_raw_fd()]).unwrap();
        drop(y);
        let fds = recv_fds(&b, 1).unwrap();
        let mut y = UnixStream::from(fds.into_iter().next().unwrap());
        x.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        y.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        let (pid, uid) = peer(&a).unwrap();
        assert_eq!(pid, std::process::id());
        // SAFETY: getuid cannot fail.
        assert_eq!(uid, unsafe { libc::getuid() });
        // Too few sockets is an error, not a short list.
        send_fds(&a, &[x.as_raw_fd()]).unwrap();
        assert!(recv_fds(&b, 2).is_err());
    }

    #[test]
    fn records_round_trip_and_secrets_compare() {
        let dir = crate::state_dir::temp_dir("adoption");
        std::fs::create_dir_all(&dir).unwrap();
        let record = ExecutorRecord {
            serial: 4,
            pid: 77,
            uid: 1001,
            tenant_key: "uid:1001".into(),
            tenant_name: "alice".into(),
            secret: new_secret().unwrap(),
            release: "0.1.0".into(),
        };
        record.save(&dir).unwrap();
        std::fs::write(dir.join("9.json"), b"not json").unwrap();
        assert_eq!(ExecutorRecord::list(&dir), vec![record.clone()]);
        assert!(
            !dir.join("9.json").exists(),
            "an unreadable record is removed"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ExecutorRecord::record_path(&dir, 4))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(record.secret.len(), 64);
        assert!(same_secret(&record.secret, &record.secret.clone()));
        assert!(!same_secret(&record.secret, &new_secret().unwrap()));
        assert!(!same_secret("ab", "abc"));
        ExecutorRecord::remove(&dir, 4);
        assert!(ExecutorRecord::list(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
