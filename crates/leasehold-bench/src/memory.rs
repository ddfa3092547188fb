//! The in-process memory store: what the library itself costs per operation, with no network or
//! disk. No floor: it is the baseline the other stores are not compared with.

use leasehold::MemoryStore;

use crate::common::{self, HeldPlan, OpBench, OpRounds};
use crate::report::{Kind, OpRow, Report};
use crate::stats::Figure;
use crate::{Plan, StoreKind};

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    let store = MemoryStore::new();
    let prefix = plan.prefix(StoreKind::Memory);
    let ops = OpBench::new(store.clone(), &prefix, plan.ops)?;
    ops.warm_up().await?;
    let mut rounds = OpRounds::default();
    for _ in 0..plan.rounds {
        ops.round(&mut rounds).await?;
    }
    for (op, r) in [
        ("acquire", &rounds.acquire),
        ("renew", &rounds.renew),
        ("release", &rounds.release),
        ("acquire+release", &rounds.acquire_release),
    ] {
        report.ops_rows.push(OpRow {
            store: "memory".to_owned(),
            op: op.to_owned(),
            kind: Kind::Lease,
            figure: Figure::of(r),
            ratio: None,
            target: None,
        });
    }
    report
        .held_rows
        .push(common::held_renewal(&store, &HeldPlan::of(plan, "memory", &prefix, 64)).await?);
    report.takeover_rows.push(
        common::graceful_takeover(
            "memory",
            &store,
            &store,
            &prefix,
            plan.graceful_trials,
            None,
        )
        .await?,
    );
    report.takeover_rows.push(
        common::expiry_takeover(
            "memory",
            &store,
            &store,
            &prefix,
            plan.expiry_trials,
            plan.expiry_ttl,
        )
        .await?,
    );
    Ok(())
}
