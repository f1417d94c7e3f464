//! The probe scenario (`--only probe`): plays the attacker of issue 40,
//! item 10. With auth on, a runner principal (the prober) asks about runs
//! another principal (the victim) started and about run ids that do not
//! exist, and times both. Both are answered NOT_FOUND alike; the question
//! is whether the time tells them apart.
//!
//! For each read (GetRun, StreamEvents, and a Signal of an application
//! event, which a runner may send only to its own runs), the bench makes
//! pairs of calls, one foreign and one unknown, in a random order within
//! the pair, one call at a time over one connection, after a warm-up. It
//! reports the share of pairs in which the foreign call was the slower
//! (ties count half): 50% means time tells nothing, and far from it either
//! way tells; the attacker of the issue saw 76% of 4,000 GetRun pairs.
//! And the median of the difference (foreign minus unknown) in µs.
//!
//! The unknown ids are the foreign ids with one random byte changed, so
//! they have the same shard and about the same place in an index ordered
//! by id.
//!
//! Without `--server` the bench starts its own server with an auth config
//! of two runners (`aaa-bench-prober`, `aaa-bench-victim`) and random
//! tokens. With `--server ADDR` the server must run with auth on, and the
//! bench needs two tokens of two different principals that have the
//! `runner` role and not `reader`: `--probe-token` (or env
//! `AAA_BENCH_PROBE_TOKEN`) and `--probe-victim-token` (or env
//! `AAA_BENCH_PROBE_VICTIM_TOKEN`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

use super::server::{wait_serving, ChildServer, ScratchDir};
use super::stats::{Problems, OP_TIMEOUT};
use aaa::proto::run_service_client::RunServiceClient;
use aaa::proto::{
    model_spec, scripted_step, GetRunRequest, ModelSpec, ScriptedModel, ScriptedStep,
    SignalRequest, StartRunRequest, StreamEventsRequest,
};

/// The victim's runs the pairs go round.
const RUNS: usize = 50;
/// Pairs of each read made first and not counted (connections, caches).
const WARM_UP: usize = 200;

/// Where the probe's tokens come from with `--server`.
pub struct Tokens {
    pub prober: String,
    pub victim: String,
}

#[derive(Debug, Serialize)]
pub struct Probe {
    /// The victim's runs the foreign calls name (as many unknown ids).
    pub runs: usize,
    pub reads: Vec<Read>,
    pub problems: Problems,
}

/// One read's pairs.
#[derive(Debug, Serialize)]
pub struct Read {
    pub method: &'static str,
    pub pairs: usize,
    /// The share of pairs in which the foreign call took longer (ties
    /// count half): 0.5 is indistinguishable.
    pub foreign_slower_share: f64,
    /// Median of (foreign - unknown) over the pairs, in µs.
    pub median_difference_us: f64,
    pub foreign_median_us: f64,
    pub unknown_median_us: f64,
}

/// Starts the server (or takes `--server` and its tokens), makes the
/// victim's runs and times `pairs` pairs of each read.
pub async fn run(
    server: Option<&str>,
    tokens: Option<Tokens>,
    store_url: Option<String>,
    pairs: usize,
) -> anyhow::Result<Probe> {
    // The child and its auth file live until the pairs are made.
    let (_child, _dir, addr, tokens) = match server {
        Some(addr) => {
            let Some(tokens) = tokens else {
                bail!(
                    "the probe scenario with --server needs a runner's token and another \
                     runner's: give --probe-token and --probe-victim-token (or \
                     AAA_BENCH_PROBE_TOKEN and AAA_BENCH_PROBE_VICTIM_TOKEN)"
                );
            };
            (None, None, addr.to_string(), tokens)
        }
        None => {
            let (child, dir, tokens) = start_with_auth(store_url).await?;
            let addr = child.addr().to_string();
            (Some(child), Some(dir), addr, tokens)
        }
    };
    if tokens.prober == tokens.victim {
        bail!("--probe-token and --probe-victim-token must be two principals' tokens");
    }
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut victim = client(&channel, &tokens.victim)?;
    let mut prober = client(&channel, &tokens.prober)?;

    eprintln!("aaa bench: probe, {RUNS} runs of another principal");
    let mut foreign = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = victim
            .start_run(finished_run())
            .await
            .context("the victim's StartRun")?;
        foreign.push(started.into_inner().run_id);
    }
    let mut coin = Coin::seeded();
    let unknown: Vec<String> = foreign
        .iter()
        .map(|id| unknown_like(id, &mut coin))
        .collect();

    let mut probe = Probe {
        runs: RUNS,
        reads: Vec::new(),
        problems: Problems::default(),
    };
    for method in ["GetRun", "StreamEvents", "Signal"] {
        eprintln!("aaa bench: probe, {pairs} pairs of {method}, foreign against unknown");
        let read = time_pairs(
            &mut prober,
            method,
            &foreign,
            &unknown,
            pairs,
            &mut coin,
            &mut probe.problems,
        )
        .await?;
        probe.reads.push(read);
    }
    Ok(probe)
}

type Client = RunServiceClient<InterceptedService<Channel, Bearer>>;

/// `authorization: Bearer TOKEN` on every call.
#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

fn client(channel: &Channel, token: &str) -> anyhow::Result<Client> {
    let value = format!("Bearer {token}")
        .parse()
        .context("a token must be visible ASCII")?;
    Ok(RunServiceClient::with_interceptor(
        channel.clone(),
        Bearer(value),
    ))
}

/// A child server with auth on: two runners with random tokens.
async fn start_with_auth(
    store_url: Option<String>,
) -> anyhow::Result<(ChildServer, ScratchDir, Tokens)> {
    let dir = ScratchDir::new("probe-auth")?;
    let tokens = Tokens {
        prober: random_token(),
        victim: random_token(),
    };
    let hash = |token: &str| hex::encode(Sha256::digest(token.as_bytes()));
    let config = format!(
        "[[principal]]\nname = \"aaa-bench-prober\"\nroles = [\"runner\"]\ntoken_sha256 = \
         \"{}\"\n\n[[principal]]\nname = \"aaa-bench-victim\"\nroles = [\"runner\"]\n\
         token_sha256 = \"{}\"\n",
        hash(&tokens.prober),
        hash(&tokens.victim)
    );
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
    let args = vec![format!("--auth-config={}", path.display())];
    let child = ChildServer::start_with("probe", store_url, args).await?;
    wait_serving(child.addr()).await?;
    Ok((child, dir, tokens))
}

fn random_token() -> String {
    uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string()
}

/// A run that ends at once: its model replies with text.
fn finished_run() -> StartRunRequest {
    StartRunRequest {
        task: "aaa bench probe".into(),
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Scripted(ScriptedModel {
                steps: vec![ScriptedStep {
                    reply: Some(scripted_step::Reply::Text("done".into())),
                }],
            })),
        }),
        ..Default::default()
    }
}

/// `id` with one byte of its random part changed: another id, unknown,
/// in the same shard (the last byte) and near it in id order.
fn unknown_like(id: &str, coin: &mut Coin) -> String {
    let mut bytes = *uuid::Uuid::parse_str(id)
        .expect("the server answers UUIDs")
        .as_bytes();
    // Bytes 9..=14 are random in a UUIDv7, and byte 15 is the shard.
    let at = 9 + (coin.next() % 6) as usize;
    bytes[at] ^= 1 + (coin.next() % 255) as u8;
    uuid::Uuid::from_bytes(bytes).hyphenated().to_string()
}

/// Times `pairs` pairs of `method` (after a warm-up), each a foreign and
/// an unknown run id in a random order. A call answered other than
/// NOT_FOUND, or a pair answered with different codes, is a problem (the
/// answer would tell what the time is measured to hide).
async fn time_pairs(
    prober: &mut Client,
    method: &'static str,
    foreign: &[String],
    unknown: &[String],
    pairs: usize,
    coin: &mut Coin,
    problems: &mut Problems,
) -> anyhow::Result<Read> {
    let mut differences = Vec::with_capacity(pairs);
    let (mut foreign_times, mut unknown_times) = (Vec::new(), Vec::new());
    let mut slower = 0.0;
    for i in 0..WARM_UP + pairs {
        let (f, u) = (&foreign[i % foreign.len()], &unknown[i % unknown.len()]);
        let foreign_first = coin.next().is_multiple_of(2);
        let (first, second) = match foreign_first {
            true => (f, u),
            false => (u, f),
        };
        let (a, a_code) = timed(prober, method, first).await?;
        let (b, b_code) = timed(prober, method, second).await?;
        let (f_time, u_time) = match foreign_first {
            true => (a, b),
            false => (b, a),
        };
        for code in [a_code, b_code] {
            if code != tonic::Code::NotFound {
                problems.add(format!("{method} of another's or an unknown run: {code:?}"));
            }
        }
        if a_code != b_code {
            problems.add(format!(
                "{method}: a foreign and an unknown run answered {a_code:?} and {b_code:?}"
            ));
        }
        if i < WARM_UP {
            continue;
        }
        let (f_us, u_us) = (micros(f_time), micros(u_time));
        slower += match f_us.partial_cmp(&u_us) {
            Some(std::cmp::Ordering::Greater) => 1.0,
            Some(std::cmp::Ordering::Equal) => 0.5,
            _ => 0.0,
        };
        differences.push(f_us - u_us);
        foreign_times.push(f_us);
        unknown_times.push(u_us);
    }
    Ok(Read {
        method,
        pairs,
        foreign_slower_share: slower / pairs.max(1) as f64,
        median_difference_us: median(&mut differences),
        foreign_median_us: median(&mut foreign_times),
        unknown_median_us: median(&mut unknown_times),
    })
}

/// One call of `method` naming `run_id`: how long until its answer, and
/// the answer's code.
async fn timed(
    prober: &mut Client,
    method: &str,
    run_id: &str,
) -> anyhow::Result<(Duration, tonic::Code)> {
    let start = Instant::now();
    let call = async {
        match method {
            "GetRun" => prober
                .get_run(GetRunRequest {
                    run_id: run_id.into(),
                })
                .await
                .map(|_| ()),
            "StreamEvents" => prober
                .stream_events(StreamEventsRequest {
                    run_id: run_id.into(),
                    ..Default::default()
                })
                .await
                .map(|_| ()),
            _ => prober
                .signal(SignalRequest {
                    run_id: run_id.into(),
                    r#type: "bench.probe".into(),
                    data_json: "{}".into(),
                    request_id: String::new(),
                })
                .await
                .map(|_| ()),
        }
    };
    let answer = tokio::time::timeout(OP_TIMEOUT, call)
        .await
        .with_context(|| format!("{method} took over {OP_TIMEOUT:?}"))?;
    let elapsed = start.elapsed();
    let code = match answer {
        Ok(()) => tonic::Code::Ok,
        Err(status) => status.code(),
    };
    Ok((elapsed, code))
}

fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// The median (sorts `values`); 0 for none.
fn median(values: &mut [f64]) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A small pseudo-random sequence (xorshift64*) for the order within a
/// pair and the unknown ids: the bench needs no stronger randomness.
struct Coin(u64);

impl Coin {
    fn seeded() -> Coin {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64);
        Coin(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_id_keeps_the_shard_and_differs() {
        let mut coin = Coin::seeded();
        let id = "01938a3c-1b2d-7e4f-8a5b-0c1d2e3f4a5b";
        for _ in 0..100 {
            let other = unknown_like(id, &mut coin);
            assert_ne!(other, id);
            assert_eq!(&other[34..], &id[34..], "the last byte is the shard");
            assert_eq!(&other[..19], &id[..19], "the time part is kept");
        }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [5.0]), 5.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
