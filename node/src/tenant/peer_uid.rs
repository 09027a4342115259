//! Which Unix user owns the client end of a loopback TCP connection.
//!
//! Stock TensorFlow clients connect over TCP only (no Unix sockets, no TLS),
//! and `SO_PEERCRED` does not work on TCP. The kernel still knows the client
//! socket's owner: one `NETLINK_SOCK_DIAG` request naming the connection's
//! exact 4-tuple (`SOCK_DIAG_BY_FAMILY`, no dump) returns it, unprivileged,
//! in tens of microseconds whatever the number of sockets (`/proc/net/tcp`
//! would be a scan of all of them). Asked once per connection, at accept.
//!
//! Pitfalls handled here: a client socket that is already closing reports
//! uid 0 and inode 0, so only an ESTABLISHED socket with an inode counts; a
//! `[::]` listener sees IPv4 clients as `::ffff:a.b.c.d`, whose socket is an
//! IPv4 one; a client in another network namespace is not found (the caller
//! must then fail closed). Linux only.

use std::io;
use std::net::{IpAddr, SocketAddr};

/// Why a connection's owner could not be told.
#[derive(Debug, thiserror::Error)]
pub enum PeerUidError {
    #[error("the peer's socket was not found (not on this host, or in another network namespace)")]
    NotFound,
    #[error("the peer's socket is not established (TCP state {0})")]
    NotEstablished(u8),
    #[error("the peer's socket is closing (no inode)")]
    Closing,
    #[error("local and peer addresses are of different families ({local} vs {peer})")]
    MixedFamilies { local: SocketAddr, peer: SocketAddr },
    #[error("sock_diag answered with a malformed message: {0}")]
    Malformed(&'static str),
    #[error("sock_diag request failed: {0}")]
    Io(#[from] io::Error),
}

/// The uid owning the client socket of a connection this process accepted:
/// `local` is the accepted socket's own address, `peer` the client's.
pub fn peer_uid(local: SocketAddr, peer: SocketAddr) -> Result<u32, PeerUidError> {
    let (local_ip, peer_ip) = match (unmapped(local.ip()), unmapped(peer.ip())) {
        (l @ IpAddr::V4(_), p @ IpAddr::V4(_)) | (l @ IpAddr::V6(_), p @ IpAddr::V6(_)) => (l, p),
        _ => return Err(PeerUidError::MixedFamilies { local, peer }),
    };
    // The client's socket has the peer's address as its own ("src") and ours as
    // its destination.
    let request = diag_request(
        SocketAddr::new(peer_ip, peer.port()),
        SocketAddr::new(local_ip, local.port()),
    );
    let reply = exchange(&request)?;
    parse_reply(&reply)
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

// linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h, net/tcp_states.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_HEADER_LEN: usize = 16;
const TCP_ESTABLISHED: u8 = 1;
const INET_DIAG_NOCOOKIE: u32 = u32::MAX;
/// `struct inet_diag_msg`: family, state, timer, retrans, the 48-byte socket
/// id, expires, rqueue, wqueue, uid, inode.
const DIAG_MSG_LEN: usize = 72;
const DIAG_MSG_STATE: usize = 1;
const DIAG_MSG_UID: usize = 64;
const DIAG_MSG_INODE: usize = 68;

/// A netlink header and `struct inet_diag_req_v2` asking for the one TCP
/// socket whose own address is `src` and whose remote address is `dst`.
fn diag_request(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let family = if src.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    let mut msg = Vec::with_capacity(NLMSG_HEADER_LEN + 56);
    msg.extend_from_slice(&0u32.to_ne_bytes()); // length, set below
    msg.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    msg.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    msg.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state: checked in the reply
    msg.extend_from_slice(&src.port().to_be_bytes());
    msg.extend_from_slice(&dst.port().to_be_bytes());
    msg.extend_from_slice(&address_bytes(src.ip()));
    msg.extend_from_slice(&address_bytes(dst.ip()));
    msg.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    msg.extend_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes());
    msg.extend_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes());
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
    msg
}

/// An address as the kernel's `__be32[4]`: IPv4 in the first word.
fn address_bytes(ip: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

/// Sends one request on a fresh netlink socket and returns the reply.
fn exchange(request: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: plain socket calls on a descriptor this function owns and
    // closes; buffers are valid for the lengths passed.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let result = (|| {
            // The kernel answers at once; a bound keeps a wedged kernel from
            // holding the accept path.
            let timeout = libc::timeval {
                tv_sec: 1,
                tv_usec: 0,
            };
            if libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let mut kernel: libc::sockaddr_nl = std::mem::zeroed();
            kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            let sent = libc::sendto(
                fd,
                request.as_ptr().cast(),
                request.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            );
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut buf = vec![0u8; 8192];
            let got = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if got < 0 {
                return Err(io::Error::last_os_error());
            }
            buf.truncate(got as usize);
            Ok(buf)
        })();
        libc::close(fd);
        result
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

/// The uid in the kernel's reply, if it names a live, established socket.
fn parse_reply(reply: &[u8]) -> Result<u32, PeerUidError> {
    let kind = read_u16(reply, 4).ok_or(PeerUidError::Malformed("short netlink header"))?;
    let body = &reply[NLMSG_HEADER_LEN.min(reply.len())..];
    if kind == NLMSG_ERROR {
        let errno = read_u32(body, 0).ok_or(PeerUidError::Malformed("short error message"))? as i32;
        return Err(match -errno {
            0 => PeerUidError::Malformed("an acknowledgement instead of a socket"),
            libc::ENOENT => PeerUidError::NotFound,
            code => PeerUidError::Io(io::Error::from_raw_os_error(code)),
        });
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(PeerUidError::Malformed("unexpected message type"));
    }
    if body.len() < DIAG_MSG_LEN {
        return Err(PeerUidError::Malformed("short inet_diag_msg"));
    }
    let state = body[DIAG_MSG_STATE];
    if state != TCP_ESTABLISHED {
        return Err(PeerUidError::NotEstablished(state));
    }
    let inode = read_u32(body, DIAG_MSG_INODE).ok_or(PeerUidError::Malformed("no inode"))?;
    if inode == 0 {
        return Err(PeerUidError::Closing);
    }
    read_u32(body, DIAG_MSG_UID).ok_or(PeerUidError::Malformed("no uid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv6Addr, TcpListener, TcpStream};

    fn own_uid() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    /// Connects to a fresh listener at `bind` and returns (our accepted side's
    /// address, the client's address, both streams kept open).
    fn connection(
        bind: &str,
        connect_ip: IpAddr,
    ) -> (SocketAddr, SocketAddr, TcpStream, TcpStream) {
        let listener = TcpListener::bind(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(SocketAddr::new(connect_ip, port)).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        (accepted.local_addr().unwrap(), peer, accepted, client)
    }

    #[test]
    fn finds_the_owner_of_an_ipv4_loopback_client() {
        let (local, peer, _a, _c) = connection("127.0.0.1:0", "127.0.0.1".parse().unwrap());
        assert_eq!(peer_uid(local, peer).unwrap(), own_uid());
    }

    #[test]
    fn finds_another_users_client() {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // only root can start a client as another user
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let nobody = 65534;
        let mut client = std::process::Command::new("bash")
            .args([
                "-c",
                &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; sleep 10"),
            ])
            .uid(nobody)
            .gid(nobody)
            .spawn()
            .unwrap();
        // A client that never connects must fail the test, not hang it.
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (accepted, peer) = loop {
            match listener.accept() {
                Ok(pair) => break pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the client did not connect"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        let result = peer_uid(accepted.local_addr().unwrap(), peer);
        let _ = client.kill();
        let _ = client.wait();
        assert_eq!(result.unwrap(), nobody);
    }

    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_is_found() {
        let Ok(listener) = TcpListener::bind("[::]:0") else {
            return; // no IPv6 on this host: nothing to check
        };
        drop(listener);
        let (local, peer, _a, _c) = connection("[::]:0", "127.0.0.1".parse().unwrap());
        assert!(peer.is_ipv6(), "expected a mapped address, got {peer}");
        assert_eq!(peer_uid(local, peer).unwrap(), own_uid());
    }

    #[test]
    fn finds_the_owner_of_an_ipv6_loopback_client() {
        if TcpListener::bind("[::1]:0").is_err() {
            return; // no IPv6 loopback on this host
        }
        let (local, peer, _a, _c) = connection("[::1]:0", IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(peer_uid(local, peer).unwrap(), own_uid());
    }

    #[test]
    fn a_connection_that_does_not_exist_is_not_found() {
        let (local, mut peer, _a, _c) = connection("127.0.0.1:0", "127.0.0.1".parse().unwrap());
        peer.set_port(if peer.port() == 1 { 2 } else { 1 });
        assert!(matches!(peer_uid(local, peer), Err(PeerUidError::NotFound)));
    }

    #[test]
    fn a_closed_client_is_never_attributed() {
        let (local, peer, accepted, client) =
            connection("127.0.0.1:0", "127.0.0.1".parse().unwrap());
        drop(client);
        // The client's socket lingers (FIN_WAIT/TIME_WAIT) or is gone: either way no uid.
        let result = peer_uid(local, peer);
        assert!(
            matches!(
                result,
                Err(PeerUidError::NotFound
                    | PeerUidError::NotEstablished(_)
                    | PeerUidError::Closing)
            ),
            "{result:?}"
        );
        drop(accepted);
    }

    #[test]
    fn mixed_families_are_refused() {
        let local: SocketAddr = "127.0.0.1:5501".parse().unwrap();
        let peer: SocketAddr = "[::1]:40000".parse().unwrap();
        assert!(matches!(
            peer_uid(local, peer),
            Err(PeerUidError::MixedFamilies { .. })
        ));
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for reply in [&[][..], &[0u8; 7], &[0u8; 20]] {
            assert!(parse_reply(reply).is_err());
        }
        let mut short = vec![0u8; NLMSG_HEADER_LEN + 10];
        short[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert!(matches!(
            parse_reply(&short),
            Err(PeerUidError::Malformed(_))
        ));
    }

    #[test]
    fn the_request_names_the_exact_tuple() {
        let src: SocketAddr = "127.0.0.2:40000".parse().unwrap();
        let dst: SocketAddr = "127.0.0.1:5501".parse().unwrap();
        let msg = diag_request(src, dst);
        assert_eq!(msg.len(), NLMSG_HEADER_LEN + 56);
        assert_eq!(read_u32(&msg, 0), Some(msg.len() as u32));
        let id = NLMSG_HEADER_LEN + 8;
        assert_eq!(&msg[id..id + 2], &40000u16.to_be_bytes());
        assert_eq!(&msg[id + 2..id + 4], &5501u16.to_be_bytes());
        assert_eq!(&msg[id + 4..id + 8], &[127, 0, 0, 2]);
        assert_eq!(&msg[id + 20..id + 24], &[127, 0, 0, 1]);
    }
}
