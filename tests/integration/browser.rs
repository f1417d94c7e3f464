//! A real headless Chromium for the web inbox tests: Debian's `chromium`
//! driven through `chromedriver` (WebDriver) on an ephemeral port, one
//! browser session (own profile, own cookies) per person. `.ci/run`
//! installs both packages. The driver process is stopped on drop; waits
//! poll the page for a condition, bounded by [`WAIT`].

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::support::WAIT;

/// The chromedriver binary (`AAA_CHROMEDRIVER` overrides).
fn chromedriver() -> String {
    std::env::var("AAA_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into())
}

/// The browser binary (`AAA_CHROMIUM` overrides).
fn chromium() -> String {
    std::env::var("AAA_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// A running chromedriver; each [`Driver::browser`] is a new session.
pub struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    /// Starts chromedriver on a port it picks, and reads which from its
    /// first lines. With `--port=0` it binds IPv4 on a free port and then
    /// IPv6 on the same number, which another process may hold; then it
    /// exits, and a new start picks another port.
    pub fn start() -> Driver {
        let mut said = Vec::new();
        for _ in 0..3 {
            match Driver::try_start() {
                Ok(driver) => return driver,
                Err(output) => said.push(output),
            }
        }
        panic!(
            "chromedriver did not say which port it listens on, three times; it said:\n{}",
            said.join("\n---\n")
        );
    }

    /// One start: the driver, or what it printed before it exited or
    /// [`WAIT`] passed.
    fn try_start() -> Result<Driver, String> {
        // Its own process group, browsers included, so that all of it can
        // be stopped together, also after a test panicked (see Drop).
        let mut child = Command::new(chromedriver())
            .arg("--port=0")
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): install Debian's chromium and chromium-driver \
                     (.ci/run does), or set AAA_CHROMEDRIVER",
                    chromedriver()
                )
            });
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let forward = |out: Box<dyn std::io::Read + Send>, tx: std::sync::mpsc::Sender<String>| {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            })
        };
        forward(Box::new(stdout), tx.clone());
        forward(Box::new(stderr), tx);
        let give_up = std::time::Instant::now() + WAIT;
        let mut said = Vec::new();
        // Ends when both pipes closed (the driver exited) or at give_up.
        while let Ok(line) =
            rx.recv_timeout(give_up.saturating_duration_since(std::time::Instant::now()))
        {
            if let Some(port) = line
                .split("started successfully on port ")
                .nth(1)
                .map(|rest| rest.trim_end_matches('.').trim().to_string())
            {
                return Ok(Driver {
                    child,
                    url: format!("http://127.0.0.1:{port}"),
                });
            }
            said.push(line);
        }
        kill_group(child.id());
        let _ = child.kill();
        let _ = child.wait();
        Err(said.join("\n"))
    }

    /// A new browser (its own profile and cookies), headless, 1100 x 900.
    pub async fn browser(&self) -> Browser {
        self.open(false).await
    }

    /// A browser that accepts any server certificate (a test CA's).
    pub async fn browser_accepting_test_certificates(&self) -> Browser {
        self.open(true).await
    }

    async fn open(&self, accept_insecure_certs: bool) -> Browser {
        let capabilities = json!({
            "acceptInsecureCerts": accept_insecure_certs,
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1100,900",
                    "--hide-scrollbars",
                    "--force-device-scale-factor=1",
                    "--disable-crash-reporter",
                    "--disable-breakpad",
                ],
            }
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session: {e}"));
        Browser { client }
    }
}

impl Drop for Driver {
    /// Asks chromedriver to quit its browsers (they remove their profiles),
    /// waits a bounded time, then stops what is left of its process group.
    fn drop(&mut self) {
        let address = self.url.trim_start_matches("http://").to_string();
        if let Ok(mut stream) = std::net::TcpStream::connect(&address) {
            use std::io::{Read, Write};
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let request =
                format!("GET /shutdown HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
            if stream.write_all(request.as_bytes()).is_ok() {
                let _ = stream.read(&mut [0u8; 256]);
            }
        }
        let give_up = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(50));
        }
        // The group's id is chromedriver's pid (process_group(0) above).
        kill_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILL to what is left of chromedriver's process group (`kill -KILL
/// -- -GROUP`; nothing left is fine).
fn kill_group(group: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

/// One person's browser.
pub struct Browser {
    pub client: Client,
}

impl Browser {
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// Runs `script` (a function body that returns a value).
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls until `condition` (a JS expression) is true on the page;
    /// panics with `what` and the page's text after [`WAIT`].
    pub async fn wait_until(&self, condition: &str, what: &str) {
        let script = format!("return !!({condition});");
        let give_up = tokio::time::Instant::now() + WAIT;
        loop {
            // A page being replaced (a form posted) may fail one poll.
            if let Ok(Value::Bool(true)) = self.client.execute(&script, vec![]).await {
                return;
            }
            if tokio::time::Instant::now() > give_up {
                let text = self.text("body").await;
                panic!("waited {WAIT:?} for {what} ({condition}); the page says:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the first element `css` selects ("" if none).
    pub async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    /// Types into the element `css` selects.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.find(css)
            .await
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("cannot type into {css}: {e}"));
    }

    /// The page's path and query.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_string(),
        }
    }

    /// Signs in at `base` with `token` (`None`: auth off, "Continue") and
    /// waits for the inbox.
    pub async fn sign_in(&self, base: &str, token: Option<&str>) {
        self.goto(&format!("{base}/signin")).await;
        if let Some(token) = token {
            self.type_into("#token", token).await;
        }
        self.find("form[action='/signin'] button")
            .await
            .click()
            .await
            .expect("click");
        self.wait_until(
            "location.pathname === '/' && document.getElementById('inbox') !== null",
            "the inbox after sign-in",
        )
        .await;
    }

    /// Whether the page scrolls sideways.
    pub async fn scrolls_sideways(&self) -> bool {
        self.eval("return document.documentElement.scrollWidth > window.innerWidth;")
            .await
            .as_bool()
            .expect("a boolean")
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// A POST from the page's own script (same origin, the session cookie
    /// goes along): the answer's status.
    pub async fn post_from_page(&self, path: &str, body: &str) -> u64 {
        let script = format!(
            "const done = arguments[arguments.length - 1];\
             fetch({path}, {{method: 'POST', headers: {{'content-type': \
             'application/x-www-form-urlencoded'}}, body: {body}, redirect: 'manual'}})\
             .then(r => done(r.status), e => done(String(e)));",
            path = json!(path),
            body = json!(body),
        );
        let answer = self
            .client
            .execute_async(&script, vec![])
            .await
            .expect("fetch from the page");
        answer
            .as_u64()
            .unwrap_or_else(|| panic!("fetch failed: {answer}"))
    }

    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
