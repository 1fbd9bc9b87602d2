//! Reloading the configuration: on a change in its file or directory (the `notify` crate:
//! inotify on Linux; the watch is on the directory, so an editor's rename-into-place and a
//! Kubernetes ConfigMap's symlink swap are seen) and on SIGHUP. A file that does not load is
//! refused with one log line naming the problem, and the configuration in force keeps
//! serving; a reload of unchanged files does nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;

use crate::config::Config;
use crate::decide::Engine;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration is in force.
    Changed,
    /// The files are as loaded before: nothing done.
    Unchanged,
    /// Refused (the message); the previous configuration keeps serving.
    Refused(String),
}

/// Loads `path` again and puts it in force if it loads.
pub fn reload(engine: &Engine, path: &Path) -> Reloaded {
    match Config::load(path) {
        Ok(config) => {
            if config.fingerprint == engine.config().fingerprint {
                return Reloaded::Unchanged;
            }
            let domains: Vec<String> = config
                .domain_names()
                .iter()
                .map(|d| (*d).to_owned())
                .collect();
            engine.set_config(config);
            engine.metrics.config_load_success.inc();
            tracing::info!("configuration reloaded: domains {domains:?}");
            Reloaded::Changed
        }
        Err(e) => {
            engine.metrics.config_load_error.inc();
            tracing::error!("configuration refused, the previous one keeps serving: {e}");
            Reloaded::Refused(e.to_string())
        }
    }
}

/// Reloads on SIGHUP, and (with `watch`) on changes under `path`'s directory. The watch and
/// the signal handler are in place when this returns (a change made after it is never
/// missed); the returned future does the reloads, until the process ends. Events closer
/// than 100 ms together make one reload.
pub fn start(
    engine: Arc<Engine>,
    path: PathBuf,
    watch: bool,
) -> Result<impl std::future::Future<Output = Result<(), String>>, String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let watcher = if watch {
        let dir = if path.is_dir() {
            path.clone()
        } else {
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        };
        let events = tx.clone();
        let mut w = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if let Ok(e) = e {
                if !e.kind.is_access() {
                    let _ = events.send(());
                }
            }
        })
        .map_err(|e| format!("watching {}: {e}", dir.display()))?;
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(|e| format!("watching {}: {e}", dir.display()))?;
        Some(w)
    } else {
        None
    };
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("SIGHUP: {e}"))?;
    if watch {
        // A change between the first load and the watch: looked at once now.
        let _ = tx.send(());
    }
    Ok(async move {
        let _watcher = watcher;
        let signals = tx.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the configuration");
                if signals.send(()).is_err() {
                    break;
                }
            }
        });
        drop(tx);
        while rx.recv().await.is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            while rx.try_recv().is_ok() {}
            let engine = engine.clone();
            let p = path.clone();
            let _ = tokio::task::spawn_blocking(move || reload(&engine, &p)).await;
        }
        Ok(())
    })
}
