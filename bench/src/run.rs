//! One system under load: the answer check, then the phases, each with the CPU time of the
//! system's processes, of the fake upstream and of the load generator.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::load::{closed_loop, closed_loop_samples, open_loop, LoadResult, Sample, Target};
use crate::procs::{own_cpu_s, ProcSet, Reading};
use crate::upstream::COMPLETION_TEXT;

/// How long and how hard each phase runs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub warmup_s: f64,
    pub phase_s: f64,
    pub rate: f64,
    pub max_in_flight: usize,
}

impl Plan {
    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_s)
    }

    fn phase(&self) -> Duration {
        Duration::from_secs_f64(self.phase_s)
    }
}

/// One phase's kind.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    /// Closed loop of unary calls at this concurrency.
    Closed(usize),
    /// Open loop of unary calls at the plan's rate.
    Open,
    /// Closed loop of streamed calls at this concurrency.
    Stream(usize),
}

impl Phase {
    pub fn name(self) -> String {
        match self {
            Phase::Closed(c) => format!("c{c}"),
            Phase::Open => "open".to_string(),
            Phase::Stream(c) => format!("stream-c{c}"),
        }
    }
}

/// The phases of the systems comparison.
pub const ALL_PHASES: [Phase; 5] = [
    Phase::Closed(1),
    Phase::Closed(16),
    Phase::Closed(64),
    Phase::Open,
    Phase::Stream(1),
];

/// CPU seconds by whom.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Cpu {
    /// The system's processes (none for the direct run).
    pub system: f64,
    /// The fake upstream.
    pub upstream: f64,
    /// This process (the load generator).
    pub loadgen: f64,
}

impl Cpu {
    fn per_1k(&self, requests: u64) -> Cpu {
        let k = requests.max(1) as f64 / 1000.0;
        Cpu {
            system: self.system / k,
            upstream: self.upstream / k,
            loadgen: self.loadgen / k,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseReport {
    pub concurrency: Option<usize>,
    pub rate: Option<f64>,
    pub stream: bool,
    #[serde(flatten)]
    pub load: LoadResult,
    pub cpu_s: Cpu,
    pub cpu_s_per_1k: Cpu,
    /// Per process of the system: CPU seconds in this phase.
    pub cpu_s_by_process: BTreeMap<String, f64>,
}

fn cpu_delta(before: &Reading, after: &Reading) -> BTreeMap<String, f64> {
    after
        .cpu_s
        .iter()
        .map(|(k, v)| (k.clone(), v - before.cpu_s.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// Runs one phase and reads the CPU time it cost.
pub async fn run_phase(
    target: &Target,
    system: &ProcSet,
    upstream: &ProcSet,
    plan: &Plan,
    phase: Phase,
) -> Result<PhaseReport> {
    let s0 = system.read();
    let u0 = upstream.read();
    let l0 = own_cpu_s();
    let load = match phase {
        Phase::Closed(c) => closed_loop(target, c, plan.phase(), false).await?,
        Phase::Open => open_loop(target, plan.rate, plan.phase(), plan.max_in_flight).await?,
        Phase::Stream(c) => closed_loop(target, c, plan.phase(), true).await?,
    };
    let s1 = system.read();
    let u1 = upstream.read();
    let l1 = own_cpu_s();
    let by_process = cpu_delta(&s0, &s1);
    let cpu = Cpu {
        system: by_process.values().sum(),
        upstream: cpu_delta(&u0, &u1).values().sum(),
        loadgen: l1 - l0,
    };
    Ok(PhaseReport {
        concurrency: match phase {
            Phase::Closed(c) | Phase::Stream(c) => Some(c),
            Phase::Open => None,
        },
        rate: matches!(phase, Phase::Open).then_some(plan.rate),
        stream: matches!(phase, Phase::Stream(_)),
        cpu_s_per_1k: cpu.per_1k(load.requests),
        cpu_s: cpu,
        cpu_s_by_process: by_process,
        load,
    })
}

/// A closed-loop phase measured in rounds (interleaved with another system's): each round's
/// own figures, and the phase's summed over its rounds (throughput = requests over the rounds'
/// summed time; latency percentiles over every round's requests; CPU summed).
#[derive(Debug, Default)]
pub struct Rounds {
    samples: Vec<Sample>,
    elapsed: Duration,
    by_process: BTreeMap<String, f64>,
    upstream: f64,
    loadgen: f64,
    /// Each round's figures, in the order run.
    pub each: Vec<LoadResult>,
}

impl Rounds {
    /// One round of `duration` at `concurrency`, with the CPU time it cost.
    pub async fn run(
        &mut self,
        target: &Target,
        system: &ProcSet,
        upstream: &ProcSet,
        concurrency: usize,
        duration: Duration,
    ) -> Result<LoadResult> {
        let s0 = system.read();
        let u0 = upstream.read();
        let l0 = own_cpu_s();
        let (samples, elapsed) = closed_loop_samples(target, concurrency, duration, false).await?;
        let s1 = system.read();
        let u1 = upstream.read();
        let l1 = own_cpu_s();
        for (k, v) in cpu_delta(&s0, &s1) {
            *self.by_process.entry(k).or_default() += v;
        }
        self.upstream += cpu_delta(&u0, &u1).values().sum::<f64>();
        self.loadgen += l1 - l0;
        self.elapsed += elapsed;
        let round = LoadResult::from_samples(samples.clone(), elapsed, false);
        self.each.push(round.clone());
        self.samples.extend(samples);
        Ok(round)
    }

    /// Seconds of load over every round.
    pub fn elapsed_s(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }

    /// The phase over every round, as one phase's report.
    pub fn report(self, concurrency: usize) -> PhaseReport {
        let load = LoadResult::from_samples(self.samples, self.elapsed, false);
        let cpu = Cpu {
            system: self.by_process.values().sum(),
            upstream: self.upstream,
            loadgen: self.loadgen,
        };
        PhaseReport {
            concurrency: Some(concurrency),
            rate: None,
            stream: false,
            cpu_s_per_1k: cpu.per_1k(load.requests),
            cpu_s: cpu,
            cpu_s_by_process: self.by_process,
            load,
        }
    }
}

/// Warms the system up (closed loop at 16, results dropped).
pub async fn warm_up(target: &Target, plan: &Plan) -> Result<()> {
    if plan.warmup_s > 0.0 {
        closed_loop(target, 16, plan.warmup(), false).await?;
    }
    Ok(())
}

/// One unary and one streamed call, read whole: what the system answers.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub unary_status: u16,
    /// `choices[0].message.content`.
    pub unary_content: Option<String>,
    /// `x-ai-router-model` (ai-router only).
    pub model_header: Option<String>,
    pub stream_status: u16,
    /// The concatenated `choices[0].delta.content` of the stream's events.
    pub stream_content: String,
    pub stream_done: bool,
    /// Both answers carry the fake upstream's completion.
    pub ok: bool,
    /// The start of the streamed answer when it is not right (for the error message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_start: Option<String>,
}

pub async fn check(target: &Target) -> Result<Check> {
    let client = ai_router_e2e::http_client()?;
    let send = |stream: bool| {
        let mut req = client
            .post(target.url.to_string())
            .header("content-type", "application/json");
        for (k, v) in target.headers_for(stream) {
            req = req.header(k.as_str(), v.as_str());
        }
        req.body(target.body_for(stream)).send()
    };
    let unary = send(false).await.context("the unary check call")?;
    let mut c = Check {
        unary_status: unary.status().as_u16(),
        model_header: unary
            .headers()
            .get("x-ai-router-model")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        ..Default::default()
    };
    let v: Value = unary.json().await.unwrap_or(Value::Null);
    c.unary_content = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::to_string);
    let stream = send(true).await.context("the streamed check call")?;
    c.stream_status = stream.status().as_u16();
    let text = stream.text().await.unwrap_or_default();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            c.stream_done = true;
            continue;
        }
        if let Ok(event) = serde_json::from_str::<Value>(data) {
            if let Some(piece) = event
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
            {
                c.stream_content.push_str(piece);
            }
        }
    }
    c.ok = c.unary_status == 200
        && c.unary_content.as_deref() == Some(COMPLETION_TEXT)
        && c.stream_status == 200
        && c.stream_done
        && c.stream_content == COMPLETION_TEXT;
    if !c.ok {
        c.stream_start = Some(text.chars().take(400).collect());
    }
    Ok(c)
}
