//! System calls a front makes while it is measured, counted by `perf stat`
//! on the kernel's `raw_syscalls:sys_enter` tracepoint for every thread of
//! its processes: a kernel counter beside the CPU column (these VMs offer
//! no hardware counters: `perf stat -e instructions` is `<not supported>`).
//!
//! Optional: without `perf`, or without the right to trace, nothing is
//! counted and the report shows "–".

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Length of one `perf stat -I` interval.
const INTERVAL: Duration = Duration::from_millis(100);

/// A `perf stat` counting in the background.
pub struct Counter {
    child: Child,
    out: PathBuf,
    started: Instant,
}

impl Counter {
    /// Starts counting the system calls of every thread `pids` have now
    /// (`None` when there are none or `perf` cannot be started).
    pub fn start(pids: &[u32]) -> Option<Counter> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let tids: Vec<String> = pids
            .iter()
            .filter_map(|p| std::fs::read_dir(format!("/proc/{p}/task")).ok())
            .flat_map(|dir| dir.flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if tids.is_empty() {
            return None;
        }
        let out = std::env::temp_dir().join(format!(
            "spinlink-bench-syscalls-{}-{}.csv",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let interval = INTERVAL.as_millis().to_string();
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-I", &interval])
            .args(["-e", "raw_syscalls:sys_enter", "-t", &tids.join(",")])
            .arg("-o")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(Counter {
            child,
            out,
            started: Instant::now(),
        })
    }

    /// Stops counting; the calls per second over the intervals that ended
    /// between `from` and `to` (`None` when there were none, or `perf`
    /// reported nothing it could count).
    pub fn stop(mut self, from: Instant, to: Instant) -> Option<f64> {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out).ok();
        let _ = std::fs::remove_file(&self.out);
        let window = (
            from.saturating_duration_since(self.started),
            to.saturating_duration_since(self.started),
        );
        per_second(&text?, window)
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // Not stopped (the measure failed): end it anyway.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.out);
        }
    }
}

/// Calls per second from `perf stat -x , -I` output, over the intervals
/// whose end falls in `window` (times since `perf` started).
fn per_second(text: &str, window: (Duration, Duration)) -> Option<f64> {
    let mut calls = 0u64;
    let mut intervals = 0u32;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        // time,count,unit,event,…
        let f: Vec<&str> = line.split(',').collect();
        let (Some(time), Some(count), Some(event)) = (f.first(), f.get(1), f.get(3)) else {
            continue;
        };
        if *event != "raw_syscalls:sys_enter" {
            continue;
        }
        let (Ok(time), Ok(count)) = (time.trim().parse::<f64>(), count.trim().parse::<u64>())
        else {
            continue;
        };
        let end = Duration::from_secs_f64(time);
        if end > window.0 && end <= window.1 {
            calls += count;
            intervals += 1;
        }
    }
    (intervals > 0).then(|| calls as f64 / (INTERVAL * intervals).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_inside_the_window_give_the_rate() {
        let text = "# started on Fri Nov 27\n\n\
             0.100212,500,,raw_syscalls:sys_enter,400000,100.00,,\n\
             0.200301,1000,,raw_syscalls:sys_enter,400000,100.00,,\n\
             0.300377,3000,,raw_syscalls:sys_enter,400000,100.00,,\n\
             0.400455,<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n\
             0.500501,9999,,raw_syscalls:sys_enter,400000,100.00,,\n";
        let window = (Duration::from_millis(150), Duration::from_millis(450));
        // 1000 and 3000 over two intervals; the one not counted is skipped.
        assert_eq!(per_second(text, window), Some(20_000.0));
        assert_eq!(
            per_second(text, (Duration::from_secs(1), Duration::from_secs(2))),
            None
        );
        assert_eq!(per_second("perf: command not found\n", window), None);
    }
}
