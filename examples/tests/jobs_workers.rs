//! Three workers of the per-job example on the real PostgreSQL: one is SIGKILLed, one is
//! paused past its leases' ttl. Every job is still completed exactly once, the killed worker's
//! jobs by the others once its leases expired, and the paused worker does not complete the jobs
//! whose leases it lost while it stood still.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_postgres::tokio_postgres::{self, NoTls};

const BIN: &str = env!("CARGO_BIN_EXE_jobs");
const JOBS: i64 = 150;

fn db() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(schema: &str, name: &str, seed: i64, dir: &std::path::Path) -> Worker {
    let file = |ext: &str| std::fs::File::create(dir.join(format!("{name}.{ext}"))).unwrap();
    let child = Command::new(BIN)
        .args(["--db", &db(), "--schema", schema, "--worker", name])
        .args([
            "--seed",
            &seed.to_string(),
            "--work",
            "300ms",
            "--ttl",
            "2s",
        ])
        .args(["--parallel", "2"])
        .stdin(Stdio::null())
        .stdout(file("out"))
        .stderr(file("log"))
        .spawn()
        .unwrap();
    Worker(child)
}

fn signal(worker: &Worker, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &worker.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

fn wait(worker: &mut Worker, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "worker did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_is_done_once_through_a_crash_and_a_pause() {
    let schema = format!("jobs_test_{:08x}", fastrand_u32());
    let dir = tempfile::tempdir().unwrap();
    let log = |n: &str| dir.path().join(format!("{n}.log"));
    let mut w1 = start(&schema, "w1", JOBS, dir.path());
    // The others start once the first has made the tables and seeded the jobs.
    let (client, connection) = tokio_postgres::connect(&db(), NoTls).await.unwrap();
    tokio::spawn(connection);
    let count = format!("SELECT count(*) FROM {schema}.jobs");
    let seeded = Instant::now();
    while client
        .query_one(&count, &[])
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
        < JOBS
    {
        assert!(
            seeded.elapsed() < Duration::from_secs(30),
            "jobs not seeded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w2 = start(&schema, "w2", 0, dir.path());
    let mut w3 = start(&schema, "w3", 0, dir.path());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(&w2, "KILL");
    signal(&w3, "STOP");
    // Past the 2 s ttl: w3's leases expire in the store and others take its jobs.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    signal(&w3, "CONT");
    assert_eq!(wait(&mut w1, Duration::from_secs(90)), Some(0));
    assert_eq!(wait(&mut w3, Duration::from_secs(90)), Some(0));
    drop(w2);

    let done: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.jobs WHERE state = 'done'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(done, JOBS, "every job done");
    // Each job's completion was reported once, by one worker (the killed one included, up to
    // its death): no job ran to completion twice.
    let mut completions = std::collections::BTreeMap::<u32, Vec<String>>::new();
    for w in ["w1", "w2", "w3"] {
        let out = std::fs::read_to_string(dir.path().join(format!("{w}.out"))).unwrap();
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix(&format!("{w}: job ")) {
                let id: u32 = rest.split(' ').next().unwrap().parse().unwrap();
                completions.entry(id).or_default().push(w.to_owned());
            }
        }
    }
    assert_eq!(completions.len() as i64, JOBS);
    let twice: Vec<_> = completions.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "completed twice: {twice:?}");
    let w3_log = std::fs::read_to_string(log("w3")).unwrap();
    println!("w3:\n{w3_log}");
    assert!(
        w3_log.contains("lease lost") || w3_log.contains("no longer held"),
        "the paused worker saw its leases lost: {w3_log}"
    );
    let by_worker = client
        .query(
            &format!("SELECT done_by, count(*) FROM {schema}.jobs GROUP BY done_by ORDER BY 1"),
            &[],
        )
        .await
        .unwrap();
    for row in by_worker {
        println!("{}: {}", row.get::<_, String>(0), row.get::<_, i64>(1));
    }
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

fn fastrand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    nanos ^ std::process::id()
}
