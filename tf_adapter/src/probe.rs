//! A short TCP connect to the server before a session is made: TensorFlow's gRPC client
//! retries an unreachable master for a long time, so a server that is down would look
//! like a hung program.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::settings::split_host_port;

/// `Err(message)` when no address of `server` (`host:port`) accepts a connection in time.
pub fn check_reachable(server: &str, timeout_s: f64) -> Result<(), String> {
    let (host, port) =
        split_host_port(server).ok_or_else(|| format!("{server:?} is not HOST:PORT"))?;
    let timeout = Duration::from_secs_f64(timeout_s.clamp(0.001, 3600.0));
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("the Salus server {server} cannot be resolved: {e}"))?
        .collect();
    let mut last = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "the Salus server {server} is not reachable ({}); start it (salus-server --listen {server}) or fix SALUS_SERVER",
        last.map(|e| e.to_string()).unwrap_or_else(|| "no address".to_string())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn listening_and_closed_ports() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert_eq!(check_reachable(&open, 2.0), Ok(()));
        drop(listener);
        let err = check_reachable(&open, 2.0).unwrap_err();
        assert!(
            err.contains("is not reachable") && err.contains(&open),
            "{err}"
        );
        assert!(check_reachable("nohost", 1.0).is_err());
    }
}
