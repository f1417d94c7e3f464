//! Checkpoints, on a thread of their own. A checkpoint puts the sealed
//! recent spans into sled (see [`super::spans`]), saves the mark saying how
//! far sled holds the log, flushes sled and fsyncs its file (flush alone is
//! not an fsync: STACK.md, trap 2). It takes tens of milliseconds (in one
//! `aaa bench` cycle run: 5,500 span lists in ~20 ms, sled's flush 2-120
//! ms); on the committer's thread, every commit behind it waited as long.
//! This thread is sled's only flusher (STACK.md, trap 1), and checkpoints
//! run one at a time.
//!
//! A mark may be saved when sled already holds more than it says (the
//! committer goes on applying records meanwhile): at open the records after
//! the mark are applied again, and applying one twice changes nothing.

use std::fs::File;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::log::Mark;
use super::spans::{Recent, Spans};
use super::{Result, StoreError};

/// The committer's handle on the checkpoint thread.
pub(super) struct Checkpointer {
    recent: Arc<Recent>,
    orders: Option<mpsc::Sender<(Mark, Arc<Spans>)>>,
    done: mpsc::Receiver<Result<()>>,
    running: bool,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub fn start(tree: sled::Db, data_file: File, recent: Arc<Recent>) -> Result<Checkpointer> {
        let (orders, orders_in) = mpsc::channel::<(Mark, Arc<Spans>)>();
        let (done_out, done) = mpsc::channel();
        let writer = recent.clone();
        let thread = std::thread::Builder::new()
            .name("aaa-checkpoint".into())
            .spawn(move || {
                for (mark, sealed) in orders_in {
                    let made = checkpoint(&tree, &data_file, &writer, mark, &sealed);
                    if done_out.send(made).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Checkpointer {
            recent,
            orders: Some(orders),
            done,
            running: false,
            thread: Some(thread),
        })
    }

    /// Whether a checkpoint is running. Err if the last one failed: sled
    /// may then hold less than a later mark would say.
    pub fn running(&mut self) -> Result<bool> {
        if self.running {
            match self.done.try_recv() {
                Ok(made) => {
                    self.running = false;
                    made?;
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => return Err(StoreError::Closed),
            }
        }
        Ok(self.running)
    }

    /// Starts a checkpoint up to `mark`, the log's end after the round just
    /// applied: seals the recent spans, which are exactly those of the
    /// records before it. Call only when none is [`running`].
    ///
    /// [`running`]: Checkpointer::running
    pub fn begin(&mut self, mark: Mark) -> Result<()> {
        let sealed = self.recent.seal();
        let orders = self.orders.as_ref().ok_or(StoreError::Closed)?;
        orders
            .send((mark, sealed))
            .map_err(|_| StoreError::Closed)?;
        self.running = true;
        Ok(())
    }

    /// Waits for a running checkpoint, makes one up to `mark`, and stops
    /// the thread (which lets go of its handle on sled).
    pub fn finish(&mut self, mark: Mark) -> Result<()> {
        let made = self.wait().and_then(|()| {
            self.begin(mark)?;
            self.wait()
        });
        self.orders = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        made
    }

    fn wait(&mut self) -> Result<()> {
        if self.running {
            self.running = false;
            return self.done.recv().map_err(|_| StoreError::Closed)?;
        }
        Ok(())
    }
}

fn checkpoint(
    tree: &sled::Db,
    data_file: &File,
    recent: &Recent,
    mark: Mark,
    sealed: &Spans,
) -> Result<()> {
    let started = Instant::now();
    let lists = recent.write_out(sealed, tree)?;
    let written = started.elapsed();
    mark.save(tree)?;
    tree.flush()?;
    data_file.sync_data()?;
    tracing::debug!(
        "checkpoint at log offset {}: {lists} span lists in {written:?}, flushed in {:?}",
        mark.offset,
        started.elapsed() - written
    );
    Ok(())
}
