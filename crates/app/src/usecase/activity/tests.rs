use std::sync::{Arc, Mutex};

use domain::{SandboxId, Timestamp};
use ports::{MockClock, MockSandboxRegistry, RegistryError};

use super::*;
use crate::test_support::{NOW, existing_ready, org};

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

/// Every batch of activity written.
type Writes = Arc<Mutex<Vec<Vec<(SandboxId, Timestamp)>>>>;

fn recording(registry: &mut MockSandboxRegistry) -> Writes {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let sink = writes.clone();
    registry.expect_touch().returning(move |batch| {
        sink.lock().unwrap().push(batch.to_vec());
        Ok(())
    });
    writes
}

#[tokio::test]
async fn one_write_per_sandbox_per_flush_whatever_the_number_of_commands() {
    let mut registry = MockSandboxRegistry::new();
    let writes = recording(&mut registry);
    let tracker = Arc::new(ActivityTracker::default());
    let (a, b) = (SandboxId::generate(1, 1), SandboxId::generate(2, 2));
    for t in 0..100 {
        tracker.touch(&a, ts(NOW + t));
    }
    tracker.touch(&b, ts(NOW));
    assert_eq!(tracker.flush(&registry, ts(NOW + 500)).await.unwrap(), 2);
    let batch = writes.lock().unwrap()[0].clone();
    assert!(batch.contains(&(a.clone(), ts(NOW + 99))) && batch.contains(&(b, ts(NOW))), "{batch:?}");
    // Nothing new: no write.
    assert_eq!(tracker.flush(&registry, ts(NOW + 600)).await.unwrap(), 0);
    assert_eq!(writes.lock().unwrap().len(), 1);

    // A command that runs long is reported as active at every flush, and its end too.
    let mut clock = MockClock::new();
    clock.expect_now().return_const(ts(NOW + 700));
    let running = tracker.begin(&a, &org(), Arc::new(clock));
    assert!(tracker.is_busy(&a));
    assert_eq!(tracker.running_by_org().get(&org()), Some(&1));
    tracker.flush(&registry, ts(NOW + 800)).await.unwrap();
    tracker.flush(&registry, ts(NOW + 900)).await.unwrap();
    drop(running);
    assert!(!tracker.is_busy(&a));
    tracker.flush(&registry, ts(NOW + 1_000)).await.unwrap();
    let w = writes.lock().unwrap();
    assert_eq!(
        w[1..].iter().map(|b| b[0].1).collect::<Vec<_>>(),
        [ts(NOW + 800), ts(NOW + 900), ts(NOW + 700)]
    );
    assert!(tracker.running_by_org().is_empty());
}

#[tokio::test]
async fn a_failed_flush_keeps_the_activity_for_the_next() {
    let mut registry = MockSandboxRegistry::new();
    let attempts = Arc::new(Mutex::new(0));
    let n = attempts.clone();
    registry.expect_touch().returning(move |_| {
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n == 1 { Err(RegistryError::Store("down".into())) } else { Ok(()) }
    });
    let tracker = ActivityTracker::default();
    tracker.touch(&SandboxId::generate(1, 1), ts(NOW));
    assert!(tracker.flush(&registry, ts(NOW)).await.is_err());
    assert_eq!(tracker.flush(&registry, ts(NOW + 1)).await.unwrap(), 1, "kept and written next time");
}

#[tokio::test]
async fn a_use_of_a_sandbox_that_looks_idle_is_written_at_once() {
    let id = SandboxId::generate(1, 1);
    let mut record = existing_ready(crate::test_support::agent_execution_key(), &id);
    record.last_active_at = ts(NOW - 1_500);
    // Timeout 2 s: 1.5 s old is past half of it, so the touch is written before the use.
    let mut registry = MockSandboxRegistry::new();
    let writes = recording(&mut registry);
    let tracker = ActivityTracker::default();
    tracker.note_before_use(&registry, &record, Some(2_000), ts(NOW)).await.unwrap();
    assert_eq!(writes.lock().unwrap().as_slice(), [vec![(id.clone(), ts(NOW))]]);
    // Recent (0.5 s): only noted; no timeout: only noted.
    let mut registry = MockSandboxRegistry::new();
    registry.expect_touch().never();
    record.last_active_at = ts(NOW - 500);
    tracker.note_before_use(&registry, &record, Some(2_000), ts(NOW)).await.unwrap();
    record.last_active_at = ts(NOW - 1_000_000);
    tracker.note_before_use(&registry, &record, None, ts(NOW)).await.unwrap();
}
