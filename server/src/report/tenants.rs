//! `# Tenants` and the per-tenant metrics: what each tenant (`--tenant`,
//! and `default` for keys no pattern names) holds and how it is served,
//! summed over the shards. Series are per tenant, so their number is
//! bounded by the tenant list, never by keys.

use kvtier_store::tenants::TenantUse;

use super::metric::{Exporter, Labels, Metric};
use super::snapshot::{sum, Info, ShardReport};
use crate::shared::Shared;

/// Keys, by shard and tenant.
pub const KEYS: Metric = Metric::gauge("kvtier_tenant_keys", "Keys stored, by tenant.");
/// Bytes held, by shard, tenant and tier.
pub const USED: Metric = Metric::gauge(
    "kvtier_tenant_used_bytes",
    "Bytes a tenant holds: tier=dram (index charges and value slots) or tier=disk (blocks in the spill tier).",
)
.bytes();
/// Reads that found their key, by tenant.
pub const HITS: Metric = Metric::counter(
    "kvtier_tenant_hits_total",
    "Reads that found their key, by tenant.",
);
/// Reads that did not, by tenant.
pub const MISSES: Metric = Metric::counter(
    "kvtier_tenant_misses_total",
    "Reads that did not find their key, by tenant.",
);
/// Keys evicted, by tenant.
pub const EVICTED: Metric = Metric::counter(
    "kvtier_tenant_evicted_keys_total",
    "Keys removed to make room, by tenant.",
);
/// Writes refused for lack of memory, by tenant.
pub const REFUSED: Metric = Metric::counter(
    "kvtier_tenant_refused_writes_total",
    "Writes not stored for lack of memory, by tenant.",
);

/// This section's metrics.
pub const METRICS: &[&Metric] = &[&KEYS, &USED, &HITS, &MISSES, &EVICTED, &REFUSED];

/// Tenant slots in use: the default and the named ones.
fn slots(shared: &Shared) -> std::ops::RangeInclusive<usize> {
    0..=shared.config.tenants.len()
}

/// `# Tenants`: one line per tenant, the default first.
pub fn info(o: &mut Info, shared: &Shared, reports: &[ShardReport]) {
    for t in slots(shared) {
        let used = |f: fn(&TenantUse) -> usize| sum(reports, |r| f(&r.tenants[t]) as u64);
        let count = |f: fn(&ShardReport) -> &[u64; kvtier_store::tenants::TENANT_SLOTS]| {
            sum(reports, |r| f(r)[t])
        };
        o.field(
            format_args!("tenant_{}", shared.config.tenant_name(t)),
            format_args!(
                "keys={},dram_bytes={},disk_bytes={},hits={},misses={},evicted_keys={},refused_writes={}",
                used(|u| u.keys),
                used(|u| u.dram),
                used(|u| u.disk),
                count(|r| &r.store.tenants.hits),
                count(|r| &r.store.tenants.misses),
                count(|r| &r.store.tenants.evicted),
                count(|r| &r.store.tenants.refused),
            ),
        );
    }
}

/// This shard's figures per tenant.
pub fn export(e: &mut Exporter, shared: &Shared, r: &ShardReport) {
    for t in slots(shared) {
        let name = shared.config.tenant_name(t);
        let labels =
            || -> Labels { vec![("shard", r.id.to_string()), ("tenant", name.to_string())] };
        let u = &r.tenants[t];
        e.gauge(&KEYS, labels(), u.keys as f64);
        for (tier, bytes) in [("dram", u.dram), ("disk", u.disk)] {
            let mut l = labels();
            l.push(("tier", tier.to_string()));
            e.gauge(&USED, l, bytes as f64);
        }
        let c = &r.store.tenants;
        e.counter(&HITS, t as u64, labels, c.hits[t]);
        e.counter(&MISSES, t as u64, labels, c.misses[t]);
        e.counter(&EVICTED, t as u64, labels, c.evicted[t]);
        e.counter(&REFUSED, t as u64, labels, c.refused[t]);
    }
}
