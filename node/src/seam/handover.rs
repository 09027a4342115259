//! Handing an accepted client connection to a tenant's executor: the socket
//! itself (SCM_RIGHTS), the bytes the supervisor already read from it, and
//! whether the client already acknowledged the supervisor's SETTINGS (see
//! `seam::replayed`), one message each on a SOCK_SEQPACKET socketpair made at
//! spawn (message boundaries kept, so a connection and its bytes never mix
//! with the next).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most bytes read ahead that travel with a connection. The supervisor
/// reads only the HTTP/2 prologue (preface, SETTINGS, the first request's
/// headers): far less in practice; a client whose first headers are larger
/// is served through the relay instead.
pub const MAX_READ_AHEAD: usize = 64 << 10;

/// A connected SOCK_SEQPACKET pair, both ends close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: valid out-array of two fds.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one fd in a control message.
fn fd_space() -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// A message header over one buffer and a control buffer; both must outlive its use.
pub(crate) fn message_header(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    header.msg_controllen = control.len() as _;
    header
}

/// A connection as it crosses: the socket, its first bytes, and whether the
/// supervisor's SETTINGS is acknowledged in them.
pub struct Handed {
    pub conn: OwnedFd,
    pub read_ahead: Vec<u8>,
    pub settings_acked: bool,
}

/// Sends `conn` and the bytes read ahead from it (blocking).
pub fn send(
    channel: &OwnedFd,
    conn: &OwnedFd,
    read_ahead: &[u8],
    settings_acked: bool,
) -> io::Result<()> {
    if read_ahead.len() > MAX_READ_AHEAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many bytes read ahead to hand over",
        ));
    }
    // One flag byte first: a message is never empty (which would read as the end).
    let mut payload = Vec::with_capacity(1 + read_ahead.len());
    payload.push(u8::from(settings_acked));
    payload.extend_from_slice(read_ahead);
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut control = vec![0u8; fd_space()];
    let header = message_header(&mut iov, &mut control);
    // SAFETY: the control buffer holds one cmsg with room for one fd.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&header);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, conn.as_raw_fd());
    }
    loop {
        // SAFETY: a valid msghdr for a socket we own.
        let sent = unsafe { libc::sendmsg(channel.as_raw_fd(), &header, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives the next connection (blocking); None once the supervisor's end is closed.
pub fn recv(channel: &OwnedFd) -> io::Result<Option<Handed>> {
    let mut data = vec![0u8; MAX_READ_AHEAD + 1];
    loop {
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut control = vec![0u8; fd_space()];
        let mut header = message_header(&mut iov, &mut control);
        // SAFETY: a valid msghdr for a socket we own; fds arrive close-on-exec.
        let got =
            unsafe { libc::recvmsg(channel.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if got == 0 {
            return Ok(None);
        }
        // SAFETY: walking the control messages the kernel filled in.
        let mut fd: Option<OwnedFd> = None;
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&header);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    let first = libc::CMSG_DATA(cmsg) as *const RawFd;
                    for i in 0..count {
                        let raw = std::ptr::read_unaligned(first.add(i));
                        // Own every fd that arrived, so extras are closed.
                        let owned = OwnedFd::from_raw_fd(raw);
                        if fd.is_none() {
                            fd = Some(owned);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&header, cmsg);
            }
        }
        let truncated = header.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
        let Some(fd) = fd else {
            // Nothing to serve; a message without a connection is skipped.
            continue;
        };
        if truncated {
            // The connection's first bytes are incomplete: serving it would
            // misread them. Dropping it closes it; the client reconnects.
            continue;
        }
        let len = got as usize;
        return Ok(Some(Handed {
            conn: fd,
            read_ahead: data[1..len].to_vec(),
            settings_acked: data[0] == 1,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_connection_and_its_bytes_arrive_together() {
        let (ours, theirs) = pair().unwrap();
        let (mut client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        send(&ours, &OwnedFd::from(server), b"PRI * HTTP/2.0", true).unwrap();
        let got = recv(&theirs).unwrap().unwrap();
        assert_eq!(got.read_ahead, b"PRI * HTTP/2.0");
        assert!(got.settings_acked);
        let mut handed = std::os::unix::net::UnixStream::from(got.conn);
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        handed.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        drop(ours);
        assert!(recv(&theirs).unwrap().is_none());
    }

    #[test]
    fn empty_read_ahead_is_kept_apart_from_the_end() {
        let (ours, theirs) = pair().unwrap();
        let (_client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        send(&ours, &OwnedFd::from(server), b"", false).unwrap();
        let got = recv(&theirs).unwrap().unwrap();
        assert!(got.read_ahead.is_empty());
        assert!(!got.settings_acked);
    }

    #[test]
    fn too_much_read_ahead_is_refused() {
        let (ours, _theirs) = pair().unwrap();
        let (_client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        let big = vec![1u8; MAX_READ_AHEAD + 1];
        assert!(send(&ours, &OwnedFd::from(server), &big, true).is_err());
    }
}
