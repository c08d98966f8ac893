//! The targets against a run's figures: the scale rows, the added latency and the
//! throughput against each peer.

use super::{div, f, rps, x, ScalePair, ScaleResult, SystemResult, Target};
use crate::airouter::Shape;

fn scale_row(scale: &[ScaleResult], pred: impl Fn(&Shape) -> bool) -> Option<&ScaleResult> {
    scale
        .iter()
        .find(|s| s.error.is_none() && s.shape.as_ref().is_some_and(&pred))
}

fn met(ok: Option<bool>) -> String {
    match ok {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "not measured".into(),
    }
}

/// The targets against this run's figures.
pub fn targets(
    systems: &[SystemResult],
    scale: &[ScaleResult],
    pairs: &[ScalePair],
    many_vk: usize,
    many_pk: usize,
) -> Vec<Target> {
    let mut out = scale_targets(scale, pairs, many_vk, many_pk);
    let find = |n: &str| systems.iter().find(|s| s.name == n && s.error.is_none());
    let ar = find("ai-router");
    out.extend(latency_targets(ar, find("envoy"), find("agentgateway")));
    out.extend(throughput_targets(ar, &find));
    // The same targets for the one-pass build, when the run measured it.
    if let Some(one_pass) = find(crate::systems::ONE_PASS) {
        let mut more = latency_targets(Some(one_pass), find("envoy"), find("agentgateway"));
        more.extend(throughput_targets(Some(one_pass), &find));
        for t in &mut more {
            t.target = format!("{} (gateway.onePass)", t.target);
        }
        out.extend(more);
    }
    out
}

/// The scale rows against the small pool: throughput, p99, memory and how fast a change
/// reaches every worker, for the large pool with every key serving and with 8 serving. A row
/// measured side by side with the small pool's is compared over their rounds (each row's c16
/// is its rounds' aggregate), the rounds' lowest and median ratio stated beside.
fn scale_targets(
    scale: &[ScaleResult],
    pairs: &[ScalePair],
    many_vk: usize,
    many_pk: usize,
) -> Vec<Target> {
    let base = scale_row(scale, |s| {
        s.virtual_keys <= 10 && s.serving_keys == 8 && s.other_keys == 0 && s.headers.change()
    });
    let all_serve = scale_row(scale, |s| {
        s.virtual_keys == many_vk && s.serving_keys == many_pk && s.headers.change()
    });
    let eight_serve = scale_row(scale, |s| {
        s.virtual_keys == many_vk
            && s.serving_keys == 8
            && s.other_keys + 8 == many_pk
            && s.headers.change()
    });
    let mut out = Vec::new();
    for (what, big) in [("all serve", all_serve), ("8 serve", eight_serve)] {
        let pool = format!("{many_vk} VK + {many_pk} PK ({what})");
        let pair = match (big, base) {
            (Some(b), Some(s)) => pairs
                .iter()
                .find(|p| p.large == b.label && p.small == s.label),
            _ => None,
        };
        out.extend(scale_row_targets(&pool, big, base, pair));
    }
    out
}

/// One large scale row's targets against the small pool's row.
fn scale_row_targets(
    pool: &str,
    big: Option<&ScaleResult>,
    base: Option<&ScaleResult>,
    pair: Option<&ScalePair>,
) -> Vec<Target> {
    let paired = pair.map_or(String::new(), |p| {
        let pct = |v: Option<f64>| v.map_or("–".into(), |v| format!("{:.0}%", v * 100.0));
        format!(
            " (side by side, {} rounds: lowest {}, median {})",
            p.rounds.len(),
            pct(p.round_rps_ratio_min),
            pct(p.round_rps_ratio_median)
        )
    });
    let rps_of = |r: Option<&ScaleResult>| {
        r.and_then(|r| r.c16.as_ref())
            .map(|p| p.load.throughput_rps)
    };
    let p99_of = |r: Option<&ScaleResult>| {
        r.and_then(|r| r.c16.as_ref())
            .map(|p| p.load.latency_ms.p99)
    };
    let tr = div(rps_of(big), rps_of(base));
    let pr = div(p99_of(big), p99_of(base));
    let total = big.map(|b| b.peak_rss_total_mb).filter(|v| *v > 0.0);
    let headers = big
        .and_then(|b| b.shape)
        .map_or("changing", |s| s.headers.prefix());
    let mut out = vec![
        Target {
            target: format!("{pool}, {headers} headers: c16 throughput ≥ 90% of 10 VK / 8 PK"),
            figure: format!(
                "{} of {} rps = {}{paired}",
                f(rps_of(big), 0),
                f(rps_of(base), 0),
                tr.map_or("–".into(), |v| format!("{:.0}%", v * 100.0))
            ),
            met: met(tr.map(|v| v >= 0.9)),
        },
        Target {
            target: format!(
                "{pool}, {headers} headers: c16 p99 within 1.2× of 10 VK / 8 PK (issue 32)"
            ),
            figure: format!(
                "{} ms vs {} ms = {}",
                f(p99_of(big), 1),
                f(p99_of(base), 1),
                x(pr)
            ),
            met: met(pr.map(|v| v <= 1.2)),
        },
        Target {
            target: format!("{pool}: Envoy + control plane under 150 MB RSS"),
            figure: format!("{} MB (peak, summed)", f(total, 0)),
            met: met(total.map(|v| v < 150.0)),
        },
    ];
    for (kind, probe) in [
        (
            "a revoked virtual key",
            big.and_then(|b| b.probes.revoke.as_ref()),
        ),
        (
            "a blacklisted provider key",
            big.and_then(|b| b.probes.blacklist.as_ref()),
        ),
    ] {
        let ms = probe.map(|p| p.every_worker_ms);
        out.push(Target {
            target: format!("{pool}: {kind} reaches every Envoy worker within 1 s"),
            figure: format!("{} ms", f(ms, 0)),
            met: met(ms.map(|v| v <= 1000.0)),
        });
    }
    out
}

/// Added latency at c1: within 2× of plain Envoy's (p50), below agentgateway's (p50, p99).
fn latency_targets(
    ar: Option<&SystemResult>,
    envoy: Option<&SystemResult>,
    agw: Option<&SystemResult>,
) -> Vec<Target> {
    let added50 = |s: Option<&SystemResult>| {
        s.and_then(|s| s.added_latency_c1.as_ref())
            .map(|a| a.p50_ms)
    };
    let added99 = |s: Option<&SystemResult>| {
        s.and_then(|s| s.added_latency_c1.as_ref())
            .map(|a| a.p99_ms)
    };
    let r = div(added50(ar), added50(envoy));
    let mut out = vec![Target {
        target: "added latency at c1 (p50) within 2× of the plain Envoy hop's".into(),
        figure: format!(
            "{} ms vs {} ms = {}",
            f(added50(ar), 3),
            f(added50(envoy), 3),
            x(r)
        ),
        met: met(r.map(|v| v <= 2.0)),
    }];
    for (what, of) in [
        (
            "p50",
            &added50 as &dyn Fn(Option<&SystemResult>) -> Option<f64>,
        ),
        ("p99", &added99),
    ] {
        let r = div(of(ar), of(agw));
        out.push(Target {
            target: format!("added latency at c1 ({what}) below agentgateway's"),
            figure: format!("{} ms vs {} ms = {}", f(of(ar), 3), f(of(agw), 3), x(r)),
            met: met(r.map(|v| v < 1.0)),
        });
    }
    out
}

/// c16 throughput against plain Envoy, Portkey and LiteLLM.
fn throughput_targets<'a>(
    ar: Option<&'a SystemResult>,
    find: &dyn Fn(&str) -> Option<&'a SystemResult>,
) -> Vec<Target> {
    let ar_rps = ar.and_then(|s| rps(s, "c16"));
    [
        ("envoy", 0.5, "at least 50% of plain Envoy's"),
        ("portkey", 5.0, "at least 5× Portkey's"),
        ("litellm", 40.0, "at least 40× LiteLLM's"),
    ]
    .into_iter()
    .map(|(peer, min, label)| {
        let peer_rps = find(peer).and_then(|s| rps(s, "c16"));
        let r = div(ar_rps, peer_rps);
        Target {
            target: format!("c16 throughput {label}"),
            figure: format!("{} vs {} rps = {}", f(ar_rps, 0), f(peer_rps, 0), x(r)),
            met: met(r.map(|v| v >= min)),
        }
    })
    .collect()
}
