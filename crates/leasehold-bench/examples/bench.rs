//! `leasehold bench` without the CLI: `cargo run --release -p leasehold-bench --example bench -- --quick`.

use clap::Parser;

/// The benchmark's flags, as `leasehold bench` takes them.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: leasehold_bench::BenchArgs,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let code = runtime.block_on(leasehold_bench::run(cli.args))?;
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(std::process::ExitCode::from(code))
}
