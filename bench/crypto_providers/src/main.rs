//! Primitive costs of each mls-rs crypto provider and cipher suite.
//!
//! Run with `cargo run --release -p svc-crypto-bench`. Prints a table of
//! operations per second (median of several rounds) so that the engine's
//! default provider and cipher suite are chosen by measurement.
//!
//! `svc-crypto-bench --json PROVIDER SUITE` prints one JSON object with the rates of
//! that combination; bench/engine.py uses it to measure its bound in the same run.

use std::time::{Duration, Instant};

use mls_rs_core::crypto::{CipherSuite, CipherSuiteProvider, CryptoProvider};

const ROUNDS: usize = 5;
const ROUND_TIME: Duration = Duration::from_millis(300);

/// Runs `op` repeatedly for ROUND_TIME, ROUNDS times; returns the median ops/s.
fn rate(mut op: impl FnMut()) -> f64 {
    let mut rates: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < ROUND_TIME {
                for _ in 0..16 {
                    op();
                }
                n += 16;
            }
            n as f64 / start.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rates[ROUNDS / 2]
}

struct Rates {
    sign: f64,
    verify: f64,
    sign_large: f64,
    verify_large: f64,
    seal_small: f64,
    open_small: f64,
    open_large: f64,
    kem_generate: f64,
}

fn measure<P: CryptoProvider>(provider: &P, suite: CipherSuite) -> Option<Rates> {
    let cs = provider.cipher_suite_provider(suite)?;
    let (sk, pk) = cs.signature_key_generate().expect("keygen");
    let msg = vec![7u8; 256];
    let sig = cs.sign(&sk, &msg).expect("sign");
    let big = vec![7u8; 16 * 1024];
    let big_sig = cs.sign(&sk, &big).expect("sign");
    let key = vec![1u8; cs.aead_key_size()];
    let nonce = vec![2u8; cs.aead_nonce_size()];
    let small = vec![3u8; 256];
    let large = vec![3u8; 16 * 1024];
    let sealed_small = cs.aead_seal(&key, &small, None, &nonce).unwrap();
    let sealed_large = cs.aead_seal(&key, &large, None, &nonce).unwrap();

    let sign = rate(|| {
        cs.sign(&sk, &msg).unwrap();
    });
    let verify = rate(|| {
        cs.verify(&pk, &sig, &msg).unwrap();
    });
    let sign_large = rate(|| {
        cs.sign(&sk, &big).unwrap();
    });
    let verify_large = rate(|| {
        cs.verify(&pk, &big_sig, &big).unwrap();
    });
    let seal_small = rate(|| {
        cs.aead_seal(&key, &small, None, &nonce).unwrap();
    });
    let open_small = rate(|| {
        cs.aead_open(&key, &sealed_small, None, &nonce).unwrap();
    });
    let open_large = rate(|| {
        cs.aead_open(&key, &sealed_large, None, &nonce).unwrap();
    });
    let kem_generate = rate(|| {
        cs.kem_generate().unwrap();
    });
    Some(Rates {
        sign,
        verify,
        sign_large,
        verify_large,
        seal_small,
        open_small,
        open_large,
        kem_generate,
    })
}

fn row(name: &str, suite: CipherSuite, rates: Option<Rates>) {
    let suite = u16::from(suite);
    match rates {
        None => println!("| {name:<10} | {suite:>5} | unsupported |"),
        Some(r) => println!(
            "| {name:<10} | {suite:>5} | {:>10.0} | {:>10.0} | {:>10.0} | {:>10.0} | {:>12.0} | {:>12.0} | {:>12.0} | {:>10.1} | {:>10.0} |",
            r.sign,
            r.verify,
            r.sign_large,
            r.verify_large,
            r.seal_small,
            r.open_small,
            r.open_large,
            r.open_large * 16.0 * 1024.0 / 1e9,
            r.kem_generate,
        ),
    }
}

fn by_name(provider: &str, suite: CipherSuite) -> Option<Rates> {
    match provider {
        "openssl" => measure(&mls_rs_crypto_openssl::OpensslCryptoProvider::default(), suite),
        "awslc" => measure(&mls_rs_crypto_awslc::AwsLcCryptoProvider::default(), suite),
        "rustcrypto" => measure(&mls_rs_crypto_rustcrypto::RustCryptoProvider::default(), suite),
        _ => None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, provider, suite] = args.as_slice() {
        if flag == "--json" {
            let suite = CipherSuite::from(suite.parse::<u16>().expect("suite is a number"));
            let Some(r) = by_name(provider, suite) else {
                eprintln!("unknown provider or unsupported suite: {provider} {}", u16::from(suite));
                std::process::exit(2);
            };
            println!(
                "{{\"sign\": {:.1}, \"verify\": {:.1}, \"sign_16k\": {:.1}, \"verify_16k\": {:.1}, \"seal_256\": {:.1}, \"open_256\": {:.1}, \"open_16k\": {:.1}, \"kem_generate\": {:.1}}}",
                r.sign, r.verify, r.sign_large, r.verify_large, r.seal_small, r.open_small, r.open_large, r.kem_generate
            );
            return;
        }
    }
    println!("Primitive rates on one core, median of {ROUNDS} rounds (ops/s).");
    println!(
        "suite 1 = MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519, suite 2 = MLS_128_DHKEMP256_AES128GCM_SHA256_P256\n"
    );
    println!("Signatures over 256 B and 16 KiB messages; AEAD is AES-128-GCM in both suites.\n");
    println!("| provider   | suite |    sign/s  |  verify/s  | sign 16K/s | vrfy 16K/s | seal 256B/s  | open 256B/s  | open 16KiB/s | open GB/s  |  kem gen/s |");
    println!("|------------|-------|------------|------------|------------|------------|--------------|--------------|--------------|------------|------------|");
    for suite in [CipherSuite::CURVE25519_AES128, CipherSuite::P256_AES128] {
        for provider in ["openssl", "awslc", "rustcrypto"] {
            row(provider, suite, by_name(provider, suite));
        }
    }
}
