//! The gateway's data-plane threads.
//!
//! Each worker is one OS thread running a single-threaded tokio runtime. The
//! listener hands every accepted connection to the worker with the fewest,
//! and everything that connection starts (its HTTP/2 task, the `Hello`
//! bridge, ingress requests) runs there. Each worker also dials and drives
//! its own connections to every sidecar (see [`crate::upstream`]), so a
//! carried stream's two halves — the agent connection's task and the
//! upstream connection's — wake each other on one thread: no cross-thread
//! wake-up, no work stealing, and the link locks between them uncontended.
//! This is the model HAProxy and Envoy use; the admin port, reloaders,
//! discovery and health checks stay on the process's shared runtime.
//!
//! Dropping [`Workers`] stops the threads; what still runs on them is
//! dropped with their runtimes.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::limits::Slots;

/// Which worker of which [`Workers`] the current thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The [`Workers`] instance (several gateways may share a process).
    pub set: u64,
    /// The worker's index in it.
    pub index: usize,
}

thread_local! {
    static CURRENT: Cell<Option<Place>> = const { Cell::new(None) };
}

/// The worker the calling thread is, if it is one.
pub fn current() -> Option<Place> {
    CURRENT.with(Cell::get)
}

static NEXT_SET: AtomicU64 = AtomicU64::new(1);

/// How many workers `configured` asks for: 0 means one per CPU the process
/// may use (cgroup quotas included).
pub fn count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Where a worker's tasks go, without keeping its thread alive: an
/// upstream pool holds these to dial each of its connections on the worker
/// that owns it.
#[derive(Debug, Clone, Default)]
pub struct Spawners {
    set: u64,
    handles: Arc<[Handle]>,
}

impl Spawners {
    /// How many workers there are (0 outside a worker set, in unit tests).
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The calling thread's index among these workers, if it is one of them.
    pub fn current(&self) -> Option<usize> {
        current()
            .filter(|p| p.set == self.set && p.index < self.handles.len())
            .map(|p| p.index)
    }

    /// Runs `task` on worker `index` (modulo their number), or on the
    /// calling runtime when there are no workers.
    pub fn spawn<F>(&self, index: usize, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            tokio::spawn(task);
        } else {
            self.handles[index % self.handles.len()].spawn(task);
        }
    }
}

struct Worker {
    handle: Handle,
    /// Dropped (or sent) to stop the thread.
    _stop: oneshot::Sender<()>,
}

/// The worker threads; see the module docs.
pub struct Workers {
    workers: Box<[Worker]>,
    /// Connections each worker serves now, by index (no ceiling).
    open: Arc<Slots<usize>>,
    spawners: Spawners,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Workers {
    /// Starts `n` (at least one) worker threads.
    pub fn start(n: usize) -> std::io::Result<Self> {
        let set = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        let mut workers = Vec::with_capacity(n.max(1));
        for index in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("spinlink-worker-{index}"))
                .spawn(move || {
                    CURRENT.with(|c| c.set(Some(Place { set, index })));
                    // Either a send or the sender's drop ends the wait.
                    let _ = runtime.block_on(stopped);
                    // What still runs here is dropped with the runtime.
                })?;
            workers.push(Worker {
                handle,
                _stop: stop,
            });
        }
        let handles: Arc<[Handle]> = workers.iter().map(|w| w.handle.clone()).collect();
        Ok(Self {
            workers: workers.into(),
            open: Slots::new(usize::MAX),
            spawners: Spawners { set, handles },
        })
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Always false: there is at least one.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Where each worker's tasks go.
    pub fn spawners(&self) -> Spawners {
        self.spawners.clone()
    }

    /// Runs `connection` — a future that serves one accepted connection —
    /// on the worker serving the fewest, where it stays.
    pub fn spawn_connection<F>(&self, connection: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let index = (0..self.workers.len())
            .min_by_key(|i| self.open.taken(i))
            .expect("at least one worker");
        let open = self.open.try_take(index).expect("no ceiling");
        self.workers[index].handle.spawn(async move {
            let _open = open;
            connection.await;
        });
    }

    /// How many connections each worker serves now.
    #[cfg(test)]
    fn open(&self) -> Vec<usize> {
        (0..self.workers.len())
            .map(|i| self.open.taken(&i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `f` on worker `index` and returns what it saw of its thread.
    async fn on(spawners: &Spawners, index: usize) -> (Option<usize>, Option<String>) {
        let (tx, rx) = oneshot::channel();
        let s = spawners.clone();
        spawners.spawn(index, async move {
            let seen = (
                s.current(),
                std::thread::current().name().map(str::to_owned),
            );
            let _ = tx.send(seen);
        });
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn tasks_run_on_the_worker_they_are_given_to() {
        let workers = Workers::start(2).unwrap();
        let s = workers.spawners();
        assert_eq!(s.current(), None, "the test's thread is no worker");
        for i in 0..4 {
            let (index, name) = on(&s, i).await;
            assert_eq!(index, Some(i % 2));
            assert_eq!(
                name.as_deref(),
                Some(format!("spinlink-worker-{}", i % 2).as_str())
            );
        }
        // Another set's workers are not these.
        let other = Workers::start(1).unwrap();
        let (tx, rx) = oneshot::channel();
        let s2 = s.clone();
        other.spawners().spawn(0, async move {
            let _ = tx.send(s2.current());
        });
        assert_eq!(rx.await.unwrap(), None);
    }

    #[tokio::test]
    async fn connections_go_to_the_least_busy_worker_and_are_counted_while_open() {
        let workers = Workers::start(2).unwrap();
        let (release, released) = tokio::sync::watch::channel(false);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let mut released = released.clone();
            let seen_tx = seen_tx.clone();
            workers.spawn_connection(async move {
                let _ = seen_tx.send(current().map(|p| p.index));
                let _ = released.wait_for(|r| *r).await;
            });
        }
        let mut on = [0, 0];
        for _ in 0..4 {
            on[seen.recv().await.unwrap().unwrap()] += 1;
        }
        assert_eq!(on, [2, 2]);
        assert_eq!(workers.open(), vec![2, 2]);
        release.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), async {
            while workers.open() != vec![0, 0] {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn dropping_the_workers_stops_their_threads_and_tasks() {
        let workers = Workers::start(1).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let (started_tx, started) = oneshot::channel();
        workers.spawners().spawn(0, async move {
            let _held = tx;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started.await.unwrap();
        drop(workers);
        // The task's sender is dropped with the worker's runtime.
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .unwrap()
            .unwrap_err();
    }

    #[test]
    fn zero_means_one_per_cpu() {
        assert_eq!(count(3), 3);
        assert!(count(0) >= 1);
    }
}
