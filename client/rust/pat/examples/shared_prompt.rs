//! A frontend in Rust: client threads (each with its own session, moved into the thread) open
//! sequences over one shared prompt, prefill them, fork one, and decode a few steps over every
//! layer of the daemon's model; every output row of every layer is checked against attention
//! computed in float64 here. Runs against a patd on the cpu backend (host staging buffers).
//!
//! K and V of a position are a function of the tokens up to it (as a model's are), so a prompt
//! block the prefix cache hands to another sequence holds the KV the reference expects; Q is
//! random. That holds only for blocks this program wrote: a block another client cached under
//! the same token ids (the Go example's prompt is 1000, 1001, ...) holds that client's KV, and
//! the check would fail for want of it. So every token id of a run is its token base plus a
//! small offset, the base drawn per run from the pid and the time in [2^30, 0x7000_0000)
//! (above the ids the other examples use) and printed; `--token-base N` pins it (a run of this
//! program with the same base finds its own KV cached, which checks the same).
//!
//! The check is a bound, not a tolerance: element x of a row may differ from float64 by
//!   B_x = u |ref_x| + a + 2 ((e^(2E) - 1) + (n + 4) 2^-24) M_x
//! u: the unit roundoff of the output dtype (f16 2^-11, bf16 2^-8, f32 2^-24), O being rounded
//! once from f32; a: half its smallest subnormal (f16 2^-25); the rest is the daemon's f32
//! arithmetic: a score of d products is off by at most E = (d + 4) 2^-24 S, S = max_j scale
//! sum_i |q_i k_ji| (so each softmax weight by a factor e^(+-2E)), and the n-term weighted sum
//! and its normalisation by (n + 4) 2^-24, both of M_x = max_j |v_jx|; the factor 2 covers
//! the merge of split partials. The worst |error| / B_x is printed; above 1 fails.
//!
//!   shared_prompt [--socket PATH] [--clients N] [--seqs N] [--decode N] [--token-base N]
//!                 [--scale S]
//!
//! `--scale S` is the reference's softmax scale (default: the daemon's, from its status); one
//! other than the daemon's makes the check fail (the test's negative control).
//!
//! Exit status 0 when every row passed and every sequence was closed, 1 otherwise, 2 usage.
use std::path::PathBuf;
use std::process::exit;
use std::thread;

use pat::{Dtype, Model, Options, Seq, Session, Step};

/// The shared prompt: 40 tokens from the token base, two full blocks and a part of a third.
const SHARED: u32 = 40;
/// Offsets from the token base of the questions' and the decode steps' tokens.
const QUESTION: u32 = 50_000;
const DECODE: u32 = 200_000;
/// Where a drawn token base lies: above other clients' ids, below 2^32 less the offsets.
const BASE_MIN: u32 = 1 << 30;
const BASE_SPAN: u32 = 0x3000_0000;

const USAGE: &str = "usage: shared_prompt [--socket PATH] [--clients N] [--seqs N] [--decode N] \
                     [--token-base N] [--scale S]";

struct Args {
    socket: Option<PathBuf>,
    clients: u32,
    seqs: u32,
    decode: u32,
    token_base: Option<u32>,
    scale: Option<f64>,
}

fn usage() -> ! {
    eprintln!("{}", USAGE);
    exit(2)
}

/// A token base of this run's own: from the pid and the time.
fn draw_token_base() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let h = splitmix(t ^ (std::process::id() as u64) << 40);
    BASE_MIN + (h % BASE_SPAN as u64) as u32
}

fn parse_args() -> Args {
    let mut a = Args {
        socket: None,
        clients: 2,
        seqs: 4,
        decode: 4,
        token_base: None,
        scale: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--help" {
            println!(
                "{}\n\
                 Client threads open N sequences each over a shared 40-token prompt through a \
                 cpu-backend patd,\nprefill, fork one, decode, and check every output row \
                 against float64 (defaults: 2 clients,\n4 sequences, 4 decode steps; token ids \
                 from a base drawn per run, --token-base pins it;\n--scale: the reference's \
                 softmax scale, by default the daemon's).",
                USAGE
            );
            exit(0);
        }
        let v = it.next().unwrap_or_else(|| usage());
        let num = || v.parse::<u32>().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--socket" => a.socket = Some(PathBuf::from(&v)),
            "--clients" => a.clients = num(),
            "--seqs" => a.seqs = num(),
            "--decode" => a.decode = num(),
            "--token-base" => a.token_base = Some(num()),
            "--scale" => a.scale = Some(v.parse::<f64>().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    if !(1..=16).contains(&a.clients) || !(1..=16).contains(&a.seqs) || a.decode > 1000 {
        eprintln!("clients and seqs: 1..16; decode: 0..1000");
        exit(2);
    }
    if !a.scale.map_or(true, |s| s.is_finite() && s > 0.0) {
        eprintln!("scale: a positive number");
        exit(2);
    }
    a
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1) from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// x as the staging buffers hold it (rounded to the model's dtype), back in f64.
fn round_to(dt: Dtype, x: f64) -> f64 {
    match dt {
        Dtype::F16 => pat::f16_to_f32(pat::f32_to_f16(x as f32)) as f64,
        Dtype::Bf16 => pat::bf16_to_f32(pat::f32_to_bf16(x as f32)) as f64,
        _ => x as f32 as f64,
    }
}

/// The dtype's unit roundoff and half its smallest subnormal.
fn rounding(dt: Dtype) -> (f64, f64) {
    match dt {
        Dtype::F16 => (2f64.powi(-11), 2f64.powi(-25)),
        Dtype::Bf16 => (2f64.powi(-8), 2f64.powi(-134)),
        _ => (2f64.powi(-24), 2f64.powi(-150)),
    }
}

/// One sequence as the frontend knows it: its tokens, the hash naming each position's KV, and
/// that KV per layer ([pos][kv_head][d], already rounded to the dtype).
#[derive(Clone)]
struct Track {
    tokens: Vec<u32>,
    hash: Vec<u64>,
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    /// KV tokens committed in the daemon
    len: usize,
}

impl Track {
    fn new(m: &Model, tokens: &[u32]) -> Track {
        let n = m.n_layers as usize;
        let mut t = Track {
            tokens: Vec::new(),
            hash: Vec::new(),
            k: vec![vec![]; n],
            v: vec![vec![]; n],
            len: 0,
        };
        for &tok in tokens {
            t.push(m, tok);
        }
        t
    }

    fn push(&mut self, m: &Model, tok: u32) {
        let h = splitmix(self.hash.last().copied().unwrap_or(0x5eed) ^ tok as u64);
        self.tokens.push(tok);
        self.hash.push(h);
        let w = (m.kv_heads * m.head_dim) as u64;
        for l in 0..m.n_layers as usize {
            for x in 0..w {
                let base = h ^ (l as u64) << 48 ^ x << 8;
                self.k[l].push(round_to(m.dtype, unit(splitmix(base))));
                self.v[l].push(round_to(m.dtype, unit(splitmix(base ^ 1))));
            }
        }
    }
}

struct Check {
    dt: Dtype,
    scale: f64,
    softcap: f64,
    worst_ratio: f64,
    worst_rel: f64,
    rows: u64,
}

impl Check {
    /// Checks O row `got` (one q head) of a token at position `pos` of `t` at layer `l`.
    fn row(
        &mut self,
        m: &Model,
        t: &Track,
        l: usize,
        pos: usize,
        kvh: usize,
        q: &[f64],
        got: &[f64],
    ) {
        let d = m.head_dim as usize;
        let w = m.kv_heads as usize * d;
        let n = pos + 1;
        let key = |j: usize| &t.k[l][j * w + kvh * d..j * w + kvh * d + d];
        let val = |j: usize| &t.v[l][j * w + kvh * d..j * w + kvh * d + d];
        let (mut s, mut big_s) = (vec![0.0; n], 0.0f64);
        for j in 0..n {
            let (mut dot, mut abs) = (0.0, 0.0);
            for (a, b) in q.iter().zip(key(j)) {
                dot += a * b;
                abs += (a * b).abs();
            }
            dot *= self.scale;
            if self.softcap > 0.0 {
                dot = self.softcap * (dot / self.softcap).tanh();
            }
            s[j] = dot;
            big_s = big_s.max(self.scale * abs);
        }
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let (mut r, mut mv, mut sum) = (vec![0.0; d], vec![0.0f64; d], 0.0);
        for j in 0..n {
            let p = (s[j] - mx).exp();
            sum += p;
            for (x, vx) in val(j).iter().enumerate() {
                r[x] += p * vx;
                mv[x] = mv[x].max(vx.abs());
            }
        }
        let (u, a) = rounding(self.dt);
        let e = (d as f64 + 4.0) * 2f64.powi(-24) * big_s;
        let f32_part = 2.0 * ((2.0 * e).exp_m1() + (n as f64 + 4.0) * 2f64.powi(-24));
        let (mut err2, mut ref2) = (0.0, 0.0);
        for x in 0..d {
            r[x] /= sum;
            let diff = (got[x] - r[x]).abs();
            let bound = u * r[x].abs() + a + f32_part * mv[x];
            // a NaN (O not written) fails too
            let ratio = if diff.is_nan() {
                f64::INFINITY
            } else {
                diff / bound
            };
            self.worst_ratio = self.worst_ratio.max(ratio);
            err2 += diff * diff;
            ref2 += r[x] * r[x];
        }
        self.worst_rel = self.worst_rel.max((err2 / ref2).sqrt());
        self.rows += 1;
    }
}

/// Writes the step's Q, K and V (f64, already rounded) into the staging buffers and poisons O.
fn stage(step: &mut Step<'_>, dt: Dtype, q: &[f64], k: &[f64], v: &[f64]) -> pat::Result<()> {
    match dt {
        Dtype::F32 => {
            let (sq, sk, sv) = step.qkv::<f32>()?;
            for (dst, src) in [(sq, q), (sk, k), (sv, v)] {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = *s as f32);
            }
            step.o_mut::<f32>()?.fill(f32::NAN);
        }
        _ => {
            let conv = if dt == Dtype::F16 {
                pat::f32_to_f16
            } else {
                pat::f32_to_bf16
            };
            let (sq, sk, sv) = step.qkv::<u16>()?;
            for (dst, src) in [(sq, q), (sk, k), (sv, v)] {
                dst.iter_mut()
                    .zip(src)
                    .for_each(|(d, s)| *d = conv(*s as f32));
            }
            step.o_mut::<u16>()?.fill(conv(f32::NAN));
        }
    }
    Ok(())
}

fn read_o(step: &Step<'_>, dt: Dtype) -> pat::Result<Vec<f64>> {
    Ok(match dt {
        Dtype::F32 => step.o::<f32>()?.iter().map(|&x| x as f64).collect(),
        Dtype::F16 => step
            .o::<u16>()?
            .iter()
            .map(|&x| pat::f16_to_f32(x) as f64)
            .collect(),
        _ => step
            .o::<u16>()?
            .iter()
            .map(|&x| pat::bf16_to_f32(x) as f64)
            .collect(),
    })
}

#[derive(Default)]
struct Report {
    steps: u64,
    prompt: u64,
    cached: u64,
    rows: u64,
    worst_ratio: f64,
    worst_rel: f64,
}

/// One checked step: every sequence in `act` brings its tokens past `len`.
fn run_step(
    s: &mut Session,
    chk: &mut Check,
    seed: &mut u64,
    seqs: &[&Seq],
    tracks: &mut [&mut Track],
) -> Result<(), String> {
    let m = *s.model();
    let (d, qh, kvh) = (m.head_dim as usize, m.q_heads as usize, m.kv_heads as usize);
    let n_new: Vec<u32> = tracks
        .iter()
        .map(|t| (t.tokens.len() - t.len) as u32)
        .collect();
    let tokens: Vec<u32> = tracks
        .iter()
        .flat_map(|t| t.tokens[t.len..].to_vec())
        .collect();
    let rows = tokens.len();
    let mut step = s
        .step(seqs, &n_new, &tokens)
        .map_err(|e| format!("step: {}", e))?;
    for l in 0..m.n_layers {
        let li = l as usize;
        let q: Vec<f64> = (0..rows * qh * d)
            .map(|_| {
                *seed = splitmix(*seed);
                round_to(m.dtype, unit(*seed))
            })
            .collect();
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for t in tracks.iter() {
            k.extend_from_slice(&t.k[li][t.len * kvh * d..]);
            v.extend_from_slice(&t.v[li][t.len * kvh * d..]);
        }
        stage(&mut step, m.dtype, &q, &k, &v).map_err(|e| format!("staging: {}", e))?;
        step.attend(l)
            .map_err(|e| format!("attend layer {}: {}", l, e))?;
        let o = read_o(&step, m.dtype).map_err(|e| format!("O: {}", e))?;
        let mut r0 = 0;
        for t in tracks.iter() {
            for pos in t.len..t.tokens.len() {
                for h in 0..qh {
                    let at = (r0 * qh + h) * d;
                    chk.row(
                        &m,
                        t,
                        li,
                        pos,
                        h / (qh / kvh),
                        &q[at..at + d],
                        &o[at..at + d],
                    );
                }
                r0 += 1;
            }
        }
    }
    let info = step.finish().map_err(|e| format!("step end: {}", e))?;
    if !info.committed || info.layers_done != m.n_layers {
        return Err(format!("step not committed: {:?}", info));
    }
    for t in tracks.iter_mut() {
        t.len = t.tokens.len();
    }
    Ok(())
}

/// What every client thread runs with.
#[derive(Clone, Copy)]
struct Run {
    n_seqs: u32,
    decode: u32,
    /// token ids are base + offset (wrapping)
    base: u32,
    scale: f64,
    softcap: f64,
}

fn client(mut s: Session, id: u32, run: Run) -> Result<Report, String> {
    let Run {
        n_seqs,
        decode,
        base,
        scale,
        softcap,
    } = run;
    let m = *s.model();
    let mut chk = Check {
        dt: m.dtype,
        scale,
        softcap,
        worst_ratio: 0.0,
        worst_rel: 0.0,
        rows: 0,
    };
    let mut seed = splitmix(0xc11e47 + id as u64);
    let mut rep = Report::default();
    let tok = |offset: u32| base.wrapping_add(offset);
    let shared: Vec<u32> = (0..SHARED).map(tok).collect();
    let mut seqs = Vec::new();
    let mut tracks = Vec::new();
    // the first sequence's prompt is written first: the others find its blocks cached
    for i in 0..n_seqs {
        let mut prompt = shared.clone();
        // and a question of its own: 4 + i tokens
        prompt.extend((0..4 + i).map(|t| tok(QUESTION + id * 1000 + i * 100 + t)));
        let (seq, cached) = s.seq_open(&prompt).map_err(|e| format!("open: {}", e))?;
        let mut t = Track::new(&m, &prompt);
        t.len = cached as usize;
        rep.prompt += prompt.len() as u64;
        rep.cached += cached as u64;
        seqs.push(seq);
        tracks.push(t);
        if i == 0 {
            let mut t0: Vec<&mut Track> = tracks.iter_mut().collect();
            run_step(&mut s, &mut chk, &mut seed, &[&seqs[0]], &mut t0)?;
            rep.steps += 1;
        }
    }
    if n_seqs > 1 {
        let refs: Vec<&Seq> = seqs[1..].iter().collect();
        let mut rest: Vec<&mut Track> = tracks[1..].iter_mut().collect();
        run_step(&mut s, &mut chk, &mut seed, &refs, &mut rest)?;
        rep.steps += 1;
    }
    // a second sample of the first request: shares its KV
    let child = s.seq_fork(&seqs[0]).map_err(|e| format!("fork: {}", e))?;
    let child_track = tracks[0].clone();
    seqs.push(child);
    tracks.push(child_track);
    for step in 0..decode {
        for (i, t) in tracks.iter_mut().enumerate() {
            t.push(&m, tok(DECODE + id * 100_000 + step * 20 + i as u32));
        }
        let refs: Vec<&Seq> = seqs.iter().collect();
        let mut all: Vec<&mut Track> = tracks.iter_mut().collect();
        run_step(&mut s, &mut chk, &mut seed, &refs, &mut all)?;
        rep.steps += 1;
    }
    for seq in seqs {
        s.seq_close(seq).map_err(|e| format!("close: {}", e))?;
    }
    rep.rows = chk.rows;
    rep.worst_ratio = chk.worst_ratio;
    rep.worst_rel = chk.worst_rel;
    Ok(rep)
}

fn main() {
    let a = parse_args();
    let sock = a.socket.clone().unwrap_or_else(pat::default_socket);
    let st = match pat::status(Some(&sock), 5000) {
        Ok(st) => st,
        Err(e) => {
            eprintln!("shared_prompt: no daemon at {}: {}", sock.display(), e);
            exit(1);
        }
    };
    let model = match st.model {
        Some(m) if matches!(m.dtype, Dtype::F16 | Dtype::Bf16 | Dtype::F32) => m,
        _ => {
            eprintln!("shared_prompt: the daemon's model dtype is unknown to this binding");
            exit(1);
        }
    };
    let daemon_scale = if st.scale > 0.0 {
        st.scale as f64
    } else {
        1.0 / (model.head_dim as f64).sqrt()
    };
    let base = a.token_base.unwrap_or_else(draw_token_base);
    println!(
        "shared_prompt: libpat {} (binding {}), patd {} on {} at {}; model {} layers, {}/{} \
         heads, d={}, {:?}",
        pat::library_version(),
        pat::BINDING_VERSION,
        st.version,
        st.backend,
        sock.display(),
        model.n_layers,
        model.q_heads,
        model.kv_heads,
        model.head_dim,
        model.dtype
    );
    println!(
        "shared_prompt: token ids from base {} (--token-base {} repeats them); reference softmax \
         scale {}{}",
        base,
        base,
        a.scale.unwrap_or(daemon_scale),
        if a.scale.is_some() {
            format!(" (--scale; the daemon's is {})", daemon_scale)
        } else {
            " (the daemon's)".into()
        }
    );
    let run = Run {
        n_seqs: a.seqs,
        decode: a.decode,
        base,
        scale: a.scale.unwrap_or(daemon_scale),
        softcap: st.softcap as f64,
    };
    let mut handles = Vec::new();
    for id in 0..a.clients {
        // staging rows for the largest step: the first prompt alone, or every other one with
        // none of it cached, or a decode step
        let len = |i: u32| SHARED + 4 + i;
        let rows = len(0).max((1..a.seqs).map(len).sum()).max(a.seqs + 1);
        let mut o = Options::new(model, rows);
        o.socket = Some(sock.clone());
        o.max_seqs = a.seqs + 1;
        o.label = Some(format!("rust-example-{}", id));
        // the reference reads KV as the model's dtype: a pool of another (fp8) is refused
        o.kv_dtype = Some(model.dtype);
        let s = match Session::connect(&o) {
            Ok(s) if s.buffers().on_gpu => {
                eprintln!("shared_prompt: a GPU session: this example needs a cpu-backend patd");
                exit(1);
            }
            Ok(s) => s,
            Err(e) => {
                eprintln!("shared_prompt: connect: {}", e);
                exit(1);
            }
        };
        // the session moves to the client's thread (Session: Send)
        handles.push(thread::spawn(move || client(s, id, run)));
    }
    let mut ok = true;
    let mut total = Report::default();
    for (id, h) in handles.into_iter().enumerate() {
        match h
            .join()
            .unwrap_or_else(|_| Err("the client thread panicked".into()))
        {
            Ok(r) => {
                let pass = r.worst_ratio <= 1.0;
                ok &= pass;
                println!(
                    "client {}: {} steps, {} rows checked, prompt tokens cached {}/{}, worst \
                     error/bound {:.3} (row relative error {:.2e}): {}",
                    id,
                    r.steps,
                    r.rows,
                    r.cached,
                    r.prompt,
                    r.worst_ratio,
                    r.worst_rel,
                    if pass { "ok" } else { "FAILED" }
                );
                total.steps += r.steps;
                total.rows += r.rows;
                total.cached += r.cached;
                total.prompt += r.prompt;
                total.worst_ratio = total.worst_ratio.max(r.worst_ratio);
                total.worst_rel = total.worst_rel.max(r.worst_rel);
            }
            Err(e) => {
                ok = false;
                println!("client {}: FAILED: {}", id, e);
            }
        }
    }
    println!(
        "shared_prompt: {} ({} clients x {} sequences + a fork, {} steps, {} rows over {} layers \
         against float64; worst error/bound {:.3}, worst row relative error {:.2e}; prefix \
         cache {} of {} prompt tokens)",
        if ok { "OK" } else { "FAILED" },
        a.clients,
        a.seqs,
        total.steps,
        total.rows,
        model.n_layers,
        total.worst_ratio,
        total.worst_rel,
        total.cached,
        total.prompt
    );
    exit(if ok { 0 } else { 1 })
}
