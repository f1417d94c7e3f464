//! The host names the pages answer to. A page of another site whose name
//! its owner points at 127.0.0.1 after it loaded (DNS rebinding) is, to
//! the browser, the same origin as that name: it could read the inbox and
//! post its forms, and with auth off nothing else stands in the way. Such a
//! request still names the other site in `Host`, so the pages answer only
//! requests naming this server: the loopback names with its port, and
//! with auth on the host of `--public-url` and the addresses it listens
//! and is advertised at; `--allow-host` adds others. A rebinding page
//! cannot name one of these, since its name is the attacker's.

use http::uri::Authority;

/// One accepted name: a host (lowercase, IPv6 in brackets) and the ports
/// it is accepted with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Accepted {
    host: String,
    ports: Ports,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ports {
    /// Any port (`--allow-host NAME`).
    Any,
    /// This one only.
    Only(u16),
    /// This one, a scheme's default (80, 443), which `Host` may leave out.
    Default(u16),
}

impl Ports {
    fn of(port: u16) -> Ports {
        match port {
            80 | 443 => Ports::Default(port),
            _ => Ports::Only(port),
        }
    }
}

/// The host names (with ports) the pages answer to.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts(Vec<Accepted>);

/// A `host[:port]` as its host (lowercase, without a final dot) and port;
/// `None` for anything else (user info, a port that is not a number).
fn split(text: &str) -> Option<(String, Option<u16>)> {
    let authority = text.trim().parse::<Authority>().ok()?;
    let host = authority.host();
    let rest = &authority.as_str()[host.len()..];
    let port = authority.port_u16();
    let plain = !host.is_empty() && !authority.as_str().contains('@');
    let port_ok = rest.is_empty() || port.is_some_and(|p| rest == format!(":{p}"));
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    (plain && port_ok && !host.is_empty()).then_some((host, port))
}

/// What `--allow-host` takes: a host name or address, with an optional
/// port (`aaa.example.com`, `aaa.internal:8080`, `[fd00::1]:50051`);
/// without a port, any port.
pub fn parse_allowed(text: &str) -> Result<String, String> {
    let text = text.trim();
    match split(text) {
        Some(_) => Ok(text.to_ascii_lowercase()),
        None => Err(format!(
            "'{text}' is not a host name with an optional port, e.g. aaa.example.com or aaa.internal:8080"
        )),
    }
}

impl AllowedHosts {
    /// The names of a server on `port`: the loopback names always (a
    /// rebinding page cannot use them).
    pub fn new(port: u16) -> AllowedHosts {
        let mut hosts = AllowedHosts::default();
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            hosts.add(host, Ports::of(port));
        }
        hosts
    }

    /// Adds a name as `--allow-host` gives it (see [`parse_allowed`]):
    /// without a port, with any port.
    pub fn add_name(&mut self, name: &str) {
        if let Some((host, port)) = split(name) {
            self.add(&host, port.map_or(Ports::Any, Ports::Only));
        }
    }

    /// Adds an address the server listens or is advertised at
    /// (`host:port`); an unspecified one (0.0.0.0, [::]) names no host.
    pub fn add_address(&mut self, address: &str) {
        match split(address) {
            Some((host, _)) if matches!(host.as_str(), "0.0.0.0" | "[::]") => {}
            Some((host, Some(port))) => self.add(&host, Ports::of(port)),
            _ => {}
        }
    }

    /// Adds the host of a URL (`--public-url`), with its port: the one it
    /// names, or its scheme's.
    pub fn add_url(&mut self, url: &str) {
        let Ok(uri) = url.parse::<http::Uri>() else {
            return;
        };
        let Some((host, port)) = uri.authority().and_then(|a| split(a.as_str())) else {
            return;
        };
        let default = match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        };
        self.add(&host, Ports::of(port.unwrap_or(default)));
    }

    fn add(&mut self, host: &str, ports: Ports) {
        let accepted = Accepted {
            host: host.to_string(),
            ports,
        };
        if !self.0.contains(&accepted) {
            self.0.push(accepted);
        }
    }

    /// Whether a request naming `authority` (its `Host`) is for this server.
    pub fn allows(&self, authority: &str) -> bool {
        let Some((host, port)) = split(authority) else {
            return false;
        };
        self.0.iter().any(|a| {
            a.host == host
                && match (a.ports, port) {
                    (Ports::Any, _) => true,
                    (Ports::Only(want) | Ports::Default(want), Some(got)) => want == got,
                    (Ports::Default(_), None) => true,
                    (Ports::Only(_), None) => false,
                }
        })
    }

    /// The accepted names, for the refusal page: `localhost:50051, ...`.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .0
            .iter()
            .map(|a| match a.ports {
                Ports::Only(port) | Ports::Default(port) => format!("{}:{port}", a.host),
                Ports::Any => a.host.clone(),
            })
            .collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_the_port_and_what_is_added() {
        let mut hosts = AllowedHosts::new(50051);
        hosts.add_name("aaa.internal");
        hosts.add_name("Box.Example:8080");
        hosts.add_url("https://aaa.example.com");
        hosts.add_address("0.0.0.0:50051");
        hosts.add_address("10.0.0.5:50051");
        for yes in [
            "localhost:50051",
            "LOCALHOST:50051",
            "127.0.0.1:50051",
            "[::1]:50051",
            "aaa.internal",
            "aaa.internal:9999",
            "box.example:8080",
            "aaa.example.com",
            "aaa.example.com:443",
            "aaa.example.com.",
            "10.0.0.5:50051",
        ] {
            assert!(hosts.allows(yes), "{yes}: {}", hosts.describe());
        }
        for no in [
            "evil.test",
            "evil.test:50051",
            "localhost",
            "localhost:50052",
            "127.0.0.1",
            "0.0.0.0:50051",
            "box.example",
            "aaa.example.com:50051",
            "user@localhost:50051",
            "localhost.evil.test:50051",
            "",
            "local host:50051",
            "localhost:abc",
            "localhost:50051:1",
        ] {
            assert!(!hosts.allows(no), "{no}");
        }
        assert_eq!(
            hosts.describe(),
            "localhost:50051, 127.0.0.1:50051, [::1]:50051, aaa.internal, box.example:8080, \
             aaa.example.com:443, 10.0.0.5:50051"
        );
    }

    #[test]
    fn a_public_url_with_a_port_is_accepted_with_that_port_only() {
        let mut hosts = AllowedHosts::new(50051);
        hosts.add_url("http://10.0.0.5:8080");
        assert!(hosts.allows("10.0.0.5:8080"));
        assert!(!hosts.allows("10.0.0.5"));
        assert!(!hosts.allows("10.0.0.5:80"));
        // On port 80 the browser leaves the port out.
        let hosts = AllowedHosts::new(80);
        assert!(hosts.allows("localhost") && hosts.allows("localhost:80"));
    }

    #[test]
    fn allow_host_values_are_checked() {
        assert_eq!(
            parse_allowed(" AAA.example.com ").unwrap(),
            "aaa.example.com"
        );
        assert_eq!(
            parse_allowed("aaa.internal:8080").unwrap(),
            "aaa.internal:8080"
        );
        assert_eq!(parse_allowed("[fd00::1]:50051").unwrap(), "[fd00::1]:50051");
        for bad in [
            "",
            "http://aaa.example.com",
            "a b",
            "user@host",
            "host:port",
        ] {
            assert!(parse_allowed(bad).is_err(), "{bad}");
        }
    }
}
