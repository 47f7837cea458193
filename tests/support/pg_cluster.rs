//! A throwaway PostgreSQL cluster of a test's own, which the test may stop and start (the
//! shared server at `DATABASE_URL` must never be stopped): `initdb` into a temporary
//! directory, served on a free port with its socket in that directory, removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A private cluster; stopped and deleted when dropped.
#[derive(Debug)]
pub struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PgCluster {
    /// Creates and starts a cluster, or `None` (skipped, or a failure under `CI=true`) when the
    /// server binaries are not installed.
    pub fn start(test: &str) -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("bin"))
            .find(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists());
        // initdb refuses to run as root: run it (and the server) as `postgres` then.
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout == b"0\n");
        let usable = bin.is_some()
            && (!root
                || Command::new("id")
                    .arg("postgres")
                    .output()
                    .is_ok_and(|o| o.status.success()));
        if !sb_testkit::require(sb_testkit::INITDB, usable) {
            return None;
        }
        let bin = bin?;
        let dir = std::env::temp_dir().join(format!("sb-inbox-pg-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = PgCluster {
            bin,
            dir,
            port,
            as_postgres: root,
        };
        if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let data = cluster.data();
        cluster.run("initdb", &["-A", "trust", "-U", "postgres", "-D", &data]);
        cluster.start_server();
        Some(cluster)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data();
        self.run(
            "pg_ctl",
            &["-D", &data, "-o", &options, "-l", &log, "-w", "start"],
        );
    }

    /// Stops the server at once (`-m fast`: open sessions are ended).
    pub fn stop_server(&self) {
        let data = self.data();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let output = self
            .command(program)
            .args(args)
            .current_dir(Path::new("/"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Best effort: the server may be stopped already.
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
