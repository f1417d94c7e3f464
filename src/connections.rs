//! The listening side of the server: accepts TCP connections, keeps at most
//! `max_connections` of them open, and closes a connection that does not
//! finish its handshake in time. Established connections that stop
//! answering are closed by HTTP/2 keepalive pings (set in `server.rs`).
//!
//! A connection over the cap gets an HTTP/2 GOAWAY (ENHANCE_YOUR_CALM)
//! whose debug text says why, then is closed: gRPC clients show that text.
//! Under TLS it is closed without a word, since those bytes would have to be
//! encrypted.
//!
//! The handshake counts as finished once the client has sent at least the
//! 24-byte HTTP/2 preface and has answered the server at least once (the
//! SETTINGS acknowledgement in plain text, the TLS key exchange under TLS).
//! A client that sends half a preface, or stops in the middle of a TLS
//! handshake, is cut off at the deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes of the HTTP/2 client preface ("PRI * HTTP/2.0...").
const PREFACE_BYTES: usize = 24;
/// How long a refused connection is given to read its GOAWAY.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Pause after an accept error (out of file descriptors, say) before the
/// next accept, so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How connections are accepted.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// TLS is on: a refusal cannot be written in plain HTTP/2.
    pub tls: bool,
}

/// The connections `listener` accepts, as the stream tonic serves. The
/// accept loop ends when `stopping` is cancelled or tonic drops the stream.
pub fn incoming(
    listener: TcpListener,
    limits: Limits,
    stopping: CancellationToken,
) -> ReceiverStream<io::Result<Connection>> {
    let (accepted, incoming) = mpsc::channel(64);
    let open = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        let mut refusals = Refusals::default();
        loop {
            let (stream, _) = tokio::select! {
                _ = stopping.cancelled() => return,
                _ = accepted.closed() => return,
                result = listener.accept() => match result {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            // A slot is taken before the check, so two accepts cannot both
            // see room for one.
            let slot = Slot::take(&open);
            if slot.count > limits.max_connections {
                refusals.note(limits.max_connections);
                tokio::spawn(refuse(stream, slot, limits));
                continue;
            }
            let _ = stream.set_nodelay(true);
            let connection = Connection {
                stream,
                _slot: slot,
                handshake: Some(Box::pin(tokio::time::sleep(limits.handshake_timeout))),
                read: 0,
                answered: false,
                wrote: false,
                put_off: false,
            };
            if accepted.send(Ok(connection)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(incoming)
}

/// One open connection's place in the count; given back on drop.
struct Slot {
    open: Arc<AtomicUsize>,
    /// Open connections, this one included, when it was taken.
    count: usize,
}

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Slot {
        let count = open.fetch_add(1, Ordering::AcqRel) + 1;
        Slot {
            open: open.clone(),
            count,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Logs refusals at most every ten seconds, with how many there were.
#[derive(Default)]
struct Refusals {
    since_logged: u64,
    logged_at: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, cap: usize) {
        self.since_logged += 1;
        let due = self
            .logged_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
        if due {
            tracing::warn!(
                "refused {} connection(s): {cap} are open, the --max-connections cap",
                self.since_logged
            );
            self.since_logged = 0;
            self.logged_at = Some(Instant::now());
        }
    }
}

/// The words a refused client sees, in the GOAWAY's debug data.
pub fn refusal_text(cap: usize) -> String {
    format!("aaa: too many connections (the server's cap is {cap}); retry later")
}

/// Tells the client why (in plain text), then closes.
async fn refuse(mut stream: TcpStream, slot: Slot, limits: Limits) {
    let _slot = slot;
    if limits.tls {
        return;
    }
    let text = refusal_text(limits.max_connections);
    let mut frames = Vec::with_capacity(26 + text.len());
    // The server preface: an empty SETTINGS frame.
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    // GOAWAY: last stream 0, ENHANCE_YOUR_CALM (0xb), then the text.
    let length = (8 + text.len()) as u32;
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0xb]);
    frames.extend_from_slice(text.as_bytes());
    let written = async {
        stream.write_all(&frames).await?;
        stream.shutdown().await?;
        // Read what the client sends until it closes: closing with unread
        // bytes would reset the connection before it reads the GOAWAY.
        let mut sink = [0; 1024];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, written).await;
}

/// An accepted TCP connection, with its slot and its handshake deadline.
pub struct Connection {
    stream: TcpStream,
    _slot: Slot,
    /// Until the handshake is over; `None` after.
    handshake: Option<Pin<Box<Sleep>>>,
    read: usize,
    /// The client sent bytes after the server had written some.
    answered: bool,
    wrote: bool,
    /// The write being asked for was put off once (see [`Connection::write_or_put_off`]).
    put_off: bool,
}

impl Connection {
    /// Writes with `write`, noting that the server wrote. Every other
    /// attempt is put off by one turn of the runtime: the connection's task
    /// goes to the back of the queue, so the responses that other tasks
    /// finish meanwhile (a group commit answers dozens of calls at once) are
    /// written with this one, in one syscall instead of one each. HTTP/2
    /// buffers whatever frames are ready before it writes, and asks again
    /// once woken.
    fn write_or_put_off(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        self.put_off = !self.put_off;
        if self.put_off {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let written = write(Pin::new(&mut self.stream), cx);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote = true;
        }
        written
    }

    fn saw_read(&mut self, n: usize) {
        self.read += n;
        self.answered |= self.wrote;
        if self.answered && self.read >= PREFACE_BYTES {
            self.handshake = None;
        }
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.handshake.is_some() {
                    this.saw_read(buf.filled().len() - before);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let late = this
                    .handshake
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if late {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not finish its handshake in time",
                    )));
                }
                Poll::Pending
            }
            failed => failed,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_or_put_off(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_or_put_off(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Wake, Waker};

    use tokio_stream::StreamExt;

    use super::*;

    /// Counts its wakes.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A write waits one turn, its task woken to come back, then goes out:
    /// what other tasks queue meanwhile joins it.
    #[tokio::test]
    async fn a_write_waits_one_turn_then_goes_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 4,
            handshake_timeout: Duration::from_secs(60),
            tls: false,
        };
        let mut accepted = incoming(listener, limits, CancellationToken::new());
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut connection = accepted.next().await.unwrap().unwrap();
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        for round in 0..2 {
            let mut pinned = Pin::new(&mut connection);
            assert!(pinned.as_mut().poll_write(&mut cx, b"one").is_pending());
            assert_eq!(
                wakes.0.load(Ordering::SeqCst),
                round + 1,
                "woken to come back"
            );
            let written = pinned.as_mut().poll_write(&mut cx, b"one");
            assert!(matches!(written, Poll::Ready(Ok(3))), "{written:?}");
            let mut read = [0u8; 3];
            client.read_exact(&mut read).await.unwrap();
            assert_eq!(&read, b"one");
        }
    }
}
