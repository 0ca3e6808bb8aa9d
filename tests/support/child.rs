//! Child processes for crash tests: the examples, built with the `failpoints` feature, run as
//! real processes that a test can SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::TestDb;

/// Builds the child programs once (with failpoints) and returns the path of one.
pub fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // The features the suite is run with (`cargo test --all-features`, which holds
            // `failpoints`, `mysql` and `nats`): the library built for the test binary is
            // reused, only the examples are linked.
            .args([
                "build",
                "--quiet",
                "--all-features",
                "--example",
                "billing",
                "--example",
                "soak_consumer",
                "--example",
                "relay",
                "--example",
                "quickstart",
                "--example",
                "two_phase_mailer",
                "--example",
                "mail_stub",
                "--example",
                "inventory",
            ])
            .status()
            .expect("run cargo build for the child programs");
        assert!(
            status.success(),
            "building the examples with --all-features failed"
        );
    });
    // target/<profile>/deps/crash-<hash> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A child process (a consumer or a relay example); its stdout and stderr lines are collected
/// (together in arrival order, and stderr's also on their own: panics are written there).
pub struct ChildProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr_lines: Arc<Mutex<Vec<String>>>,
    events: mpsc::Receiver<String>,
}

impl ChildProcess {
    /// Starts example `program` with `args`, on the test's database and broker, with
    /// `failpoint` (`<name>:<n>`) armed if given. A `NATS_URL` in the test's own environment is
    /// never passed on (the examples would run on NATS): only one given in `env`
    /// ([`ChildProcess::start_with_env`], [`ChildProcess::start_with`]).
    pub fn start(
        program: &str,
        db: &TestDb,
        brokers: &str,
        args: &[&str],
        failpoint: Option<&str>,
    ) -> Self {
        Self::start_with_env(program, db, brokers, args, failpoint, &[])
    }

    /// [`ChildProcess::start`] with extra environment variables.
    pub fn start_with_env(
        program: &str,
        db: &TestDb,
        brokers: &str,
        args: &[&str],
        failpoint: Option<&str>,
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = Command::new(example(program));
        cmd.args(args)
            .env_remove("NATS_URL")
            .envs(env.iter().copied())
            .env("DATABASE_URL", db.url())
            .env("KAFKA_BROKERS", brokers)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoint {
            Some(fp) => cmd.env("INOUTBOX_FAILPOINT", fp),
            None => cmd.env_remove("INOUTBOX_FAILPOINT"),
        };
        let child = cmd.spawn().expect("spawn child consumer");
        Self::collect(child)
    }

    /// Starts example `program` on the database at `database_url` (MariaDB's, say) and the
    /// broker, with `failpoint` armed if given.
    pub fn start_on(
        program: &str,
        database_url: &str,
        brokers: &str,
        args: &[&str],
        failpoint: Option<&str>,
    ) -> Self {
        let mut cmd = Command::new(example(program));
        cmd.args(args)
            .env("DATABASE_URL", database_url)
            .env("KAFKA_BROKERS", brokers)
            .env_remove("NATS_URL")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoint {
            Some(fp) => cmd.env("INOUTBOX_FAILPOINT", fp),
            None => cmd.env_remove("INOUTBOX_FAILPOINT"),
        };
        Self::collect(cmd.spawn().expect("spawn child consumer"))
    }

    /// Collects the output lines of a child started with piped stdout and stderr.
    fn collect(mut child: Child) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr_lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, events) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        for (stream, own) in [
            (Box::new(stdout) as Box<dyn std::io::Read + Send>, None),
            (Box::new(stderr), Some(stderr_lines.clone())),
        ] {
            let (lines, tx) = (lines.clone(), tx.clone());
            std::thread::spawn(move || {
                // Lines are read as bytes: a child may print anything a producer sent.
                for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                    let line = String::from_utf8_lossy(&line).into_owned();
                    let _ = tx.send(line.clone());
                    if let Some(own) = &own {
                        own.lock().unwrap().push(line.clone());
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Self {
            child,
            lines,
            stderr_lines,
            events,
        }
    }

    /// Every line printed so far (stdout and stderr, in arrival order).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The lines printed on stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr_lines.lock().unwrap().clone()
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line containing `needle`.
    pub fn wait_for(&self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!(
                    "the child never printed {needle:?} within {within:?} (built without the `failpoints` \
                     feature? run scripts/test); its output:\n{}",
                    self.lines.lock().unwrap().join("\n")
                ),
            }
        }
    }

    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// SIGKILL: no cleanup, no commit, no leaving the group.
    pub fn kill9(&mut self) -> std::process::ExitStatus {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap")
    }

    /// SIGSTOP: the whole process paused (its timers, its lease renewals, its open
    /// transaction), as a stalled VM.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: a paused process resumes where it stopped.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.child.id());
    }

    /// Waits for a line containing `needle` printed from now on (the lines already printed
    /// are passed over).
    pub fn wait_for_next(&self, needle: &str, within: Duration) {
        while self.events.try_recv().is_ok() {}
        self.wait_for(needle, within);
    }

    /// SIGTERM, and the exit status of the graceful shutdown.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "child did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildProcess {
    /// Starts example `program` with `args` and exactly the given `DATABASE_URL` and
    /// `KAFKA_BROKERS` (e.g. through proxies) plus `env`; no failpoint.
    pub fn start_with(
        program: &str,
        database_url: &str,
        brokers: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = Command::new(example(program));
        cmd.args(args)
            .env("DATABASE_URL", database_url)
            .env("KAFKA_BROKERS", brokers)
            .env("NO_COLOR", "1")
            .env_remove("INOUTBOX_FAILPOINT")
            .env_remove("NATS_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        Self::collect(child)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every line printed so far.
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}
