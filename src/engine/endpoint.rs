//! RPC endpoints (`host:port`): parsed and probed here, in plain Rust, before ggml-rpc sees them,
//! because ggml-rpc aborts the process on a malformed endpoint or a server that does not answer.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{Error, Result};

/// A parsed `host:port`. ggml-rpc splits at the first ':' and resolves the host itself, so the
/// host must not contain ':' (no IPv6 literals) and the port must be 1..=65535.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn parse(text: &str) -> Result<Endpoint> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "RPC endpoint {text:?} is not host:port ({why}); e.g. \"127.0.0.1:50052\""
            ))
        };
        let (host, port) = text.split_once(':').ok_or_else(|| bad("no ':'"))?;
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if host.contains(':') || port.contains(':') {
            return Err(bad("IPv6 literals are not supported by ggml-rpc"));
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        {
            return Err(bad("the host has characters a host name cannot have"));
        }
        if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) || port.len() > 5 {
            return Err(bad("the port is not a number"));
        }
        let port: u32 = port.parse().map_err(|_| bad("the port is not a number"))?;
        if port == 0 || port > 65535 {
            return Err(bad("the port must be in 1..=65535"));
        }
        Ok(Endpoint {
            host: host.to_string(),
            port: port as u16,
        })
    }

    /// Whether the host is a loopback name or address (serving anything else needs allowRemote).
    pub fn is_loopback(&self) -> bool {
        if self.host.eq_ignore_ascii_case("localhost") {
            return true;
        }
        self.host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    }

    fn addrs(&self) -> Result<Vec<SocketAddr>> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| Error::RpcUnreachable(format!("{self}: cannot resolve the host ({e})")))?
            .filter(SocketAddr::is_ipv4)
            .collect();
        if addrs.is_empty() {
            return Err(Error::RpcUnreachable(format!(
                "{self}: the host has no IPv4 address"
            )));
        }
        Ok(addrs)
    }

    /// Checks that something accepts TCP connections at the endpoint within `timeout`.
    pub fn probe(&self, timeout: Duration) -> Result<()> {
        let mut last = None;
        for addr in self.addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(Error::RpcUnreachable(format!(
            "{self}: {} (start it with `npx llama-branch rpc-server --port {}`)",
            last.map_or_else(|| "no address".to_string(), |e| e.to_string()),
            self.port
        )))
    }
}

impl Endpoint {
    /// Whether the endpoint actively refuses connections (nothing listens: a dead server), as
    /// opposed to accepting them or letting them time out.
    pub fn refuses(&self, timeout: Duration) -> bool {
        let Ok(addrs) = self.addrs() else {
            return true;
        };
        addrs.iter().all(|addr| {
            matches!(
                TcpStream::connect_timeout(addr, timeout),
                Err(e) if e.kind() != std::io::ErrorKind::TimedOut
                    && e.kind() != std::io::ErrorKind::WouldBlock
            )
        })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port() {
        let e = Endpoint::parse("127.0.0.1:50052").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 50052));
        assert_eq!(e.to_string(), "127.0.0.1:50052");
        assert!(e.is_loopback());
        assert!(Endpoint::parse("localhost:1").unwrap().is_loopback());
        assert!(!Endpoint::parse("10.0.0.2:1").unwrap().is_loopback());
        assert!(!Endpoint::parse("0.0.0.0:1").unwrap().is_loopback());
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "",
            "127.0.0.1",
            ":50052",
            "127.0.0.1:",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:5x",
            "127.0.0.1:-1",
            "::1:50052",
            "a b:1",
            "127.0.0.1:123456",
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert_eq!(e.code(), "ERR_INVALID_ARG", "{bad}");
        }
    }

    #[test]
    fn probe_of_closed_port_is_unreachable() {
        // Bind then drop: the port is (almost certainly) closed right after.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = Endpoint::parse(&format!("127.0.0.1:{port}"))
            .unwrap()
            .probe(Duration::from_millis(500))
            .unwrap_err();
        assert_eq!(e.code(), "ERR_RPC_UNREACHABLE");
        assert!(Endpoint::parse(&format!("127.0.0.1:{port}"))
            .unwrap()
            .refuses(Duration::from_millis(500)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        Endpoint::parse(&format!("127.0.0.1:{port}"))
            .unwrap()
            .probe(Duration::from_millis(500))
            .unwrap();
        assert!(!Endpoint::parse(&format!("127.0.0.1:{port}"))
            .unwrap()
            .refuses(Duration::from_millis(500)));
    }
}
