//! Waiting for a condition with a deadline: the one poll loop of the tests.
//! A check returns a `bool`, an `Option` (the value waited for) or a
//! `Result` (its `Err` says what was seen instead, and is printed when the
//! deadline passes).

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a poll waits before it checks again.
pub const POLL: Duration = Duration::from_millis(10);

/// What a check returns: ready with a value, or not yet (and what it saw).
pub trait Outcome {
    /// The value waited for.
    type Value;
    /// `Ok(value)` when ready, else what was seen (for the timeout's message).
    fn ready(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn ready(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err(String::new())
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Debug> Outcome for Result<T, E> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

fn timed_out(within: Duration, what: &str, last: &str) -> ! {
    if last.is_empty() {
        panic!("timed out after {within:?} waiting for {what}")
    }
    panic!("timed out after {within:?} waiting for {what}; last seen: {last}")
}

/// Check `check` every [`POLL`] (blocking the thread between checks) until
/// it is ready, and return its value; panic naming `what` (and the last
/// `Err` seen) if `within` passes first.
#[track_caller]
pub fn eventually<O: Outcome>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> O,
) -> O::Value {
    let deadline = Instant::now() + within;
    loop {
        match check().ready() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => timed_out(within, what, &last),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// [`eventually`] for async tests: `check` returns a future, and the wait
/// between checks is a tokio sleep (under paused time it takes no time;
/// the deadline is real time all the same).
pub async fn eventually_async<O, F, Fut>(within: Duration, what: &str, mut check: F) -> O::Value
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await.ready() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => timed_out(within, what, &last),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn returns_the_value_once_ready() {
        let n = Cell::new(0);
        let v = eventually(Duration::from_secs(5), "the third check", || {
            n.set(n.get() + 1);
            (n.get() == 3).then_some(n.get())
        });
        assert_eq!(v, 3);
    }

    #[test]
    #[should_panic(expected = "waiting for never; last seen: \"still 7\"")]
    fn panics_with_what_it_saw_at_the_deadline() {
        eventually(Duration::from_millis(30), "never", || {
            Err::<(), _>("still 7")
        });
    }

    #[tokio::test]
    async fn the_async_form_awaits_each_check() {
        let n = Cell::new(0);
        eventually_async(Duration::from_secs(5), "two checks", || async {
            n.set(n.get() + 1);
            n.get() >= 2
        })
        .await;
        assert_eq!(n.get(), 2);
    }
}
