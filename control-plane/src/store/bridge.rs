//! Blocking calls onto an async client: the stores' traits block (their callers run them with
//! `spawn_blocking`), while the Redis and Postgres clients are async. A [`Bridge`] owns a small
//! runtime of its own, runs each call there under a deadline and waits for the answer on a
//! plain channel, so it works from any thread that may block, inside another runtime or not.

use std::future::Future;
use std::time::Duration;

/// One worker thread running the clients' futures.
#[derive(Debug)]
pub struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    pub fn new(name: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| format!("{name}: cannot start its runtime: {e}"))?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `call` on the bridge's runtime and waits for it, at most `deadline`.
    pub fn run<T, F>(&self, deadline: Duration, call: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, String>> + Send + 'static,
    {
        let Some(runtime) = self.runtime.as_ref() else {
            return Err("stopped".to_owned());
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let answer = match tokio::time::timeout(deadline, call).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {} ms", deadline.as_millis())),
            };
            let _ = tx.send(answer);
        });
        rx.recv()
            .map_err(|_| "the call was dropped".to_owned())
            .and_then(|answer| answer)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside another runtime: let it go instead.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_times_out() {
        let Ok(bridge) = Bridge::new("bridge-test") else {
            panic!("no runtime");
        };
        assert_eq!(bridge.run(Duration::from_secs(1), async { Ok(7) }), Ok(7));
        let late = bridge.run(Duration::from_millis(20), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(1)
        });
        assert!(
            matches!(&late, Err(m) if m.contains("within 20 ms")),
            "{late:?}"
        );
    }

    #[tokio::test]
    async fn works_from_inside_another_runtime_and_drops_there() {
        let answer = tokio::task::spawn_blocking(|| {
            let bridge = Bridge::new("bridge-test")?;
            bridge.run(Duration::from_secs(1), async { Ok("yes") })
        })
        .await;
        assert!(matches!(answer, Ok(Ok("yes"))));
        let bridge = Bridge::new("bridge-test");
        drop(bridge);
    }
}
