//! The in-process memory store: what the library itself costs per operation, with no network or
//! disk. No floor: it is the baseline the other stores are not compared with.

use leasehold::MemoryStore;

use crate::common::{self, HeldPlan, OpBench, OpRounds, OpTargets};
use crate::error::Result;
use crate::plan::{Plan, StoreKind};
use crate::report::Report;

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> Result<()> {
    let store = MemoryStore::new();
    let prefix = plan.prefix(StoreKind::Memory);
    let ops = OpBench::new(store.clone(), &prefix, plan.ops)?;
    ops.warm_up().await?;
    let mut rounds = OpRounds::default();
    for _ in 0..plan.rounds {
        ops.round(&mut rounds).await?;
    }
    report
        .operations
        .extend(rounds.rows("memory", None, OpTargets::default()));
    let held = HeldPlan::of(plan, "memory", &prefix, 64);
    common::held_and_takeovers(plan, report, &held, &store, &store, None).await
}
