//! The `ckalloc` command-line tool (feature `cli`).
//!
//! ```text
//! ckalloc probe                       huge-page state, and what each tier does right now
//! ckalloc pack MODEL.safetensors -o DIR [--version 4|5] [--align N]
//! ckalloc inspect DIR/weights.bump    header, checksum, tensor table, gaps/overlaps
//! ckalloc load DIR/weights.bump [--mode auto|anon|mixed] [--activations SIZE]
//! ckalloc demo [MODEL.safetensors]    pack, load three ways, verify, compute
//! ckalloc synth DIR                   write the demo's synthetic model
//! ckalloc run -- CMD ARGS...          run a program with libckalloc_preload.so preloaded
//! ```
//!
//! Every command takes `--json` (one JSON document on stdout). Errors are one
//! line on stderr (and `{"error": ...}` on stdout with `--json`), exit status 1
//! (2 for a usage error); the tool never shows a panic or a backtrace.
//! See docs/cli.md.

mod arena_load;
mod args;
mod commands;
mod error;
mod format;
mod model;
mod output;
mod packing;
mod resident;
mod settings;
mod sigbus;
mod synthetic;
mod weights_file;

use clap::{Args, Parser, Subcommand};
use commands::{demo, inspect, load, pack, probe, run as run_cmd, synth};
use error::CliError;
use std::process::ExitCode;

/// Huge-page memory, weights.bump arenas and the caching allocator, from the shell.
#[derive(Parser, Debug)]
#[command(name = "ckalloc", version, about, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand accepts.
#[derive(Args, Debug, Clone, Copy)]
struct Global {
    /// Print one JSON document on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the system's huge-page state and time a 64 MiB first touch on each tier.
    Probe(probe::ProbeArgs),
    /// Pack a safetensors model into weights.bump + weights_manifest.{json,map}.
    Pack(pack::PackArgs),
    /// Show a weights.bump: header, checksum, tensor table, gaps and overlaps.
    Inspect(inspect::InspectArgs),
    /// Build an arena on a weights.bump, materialize, verify, report mode, timing and coverage.
    Load(load::LoadArgs),
    /// The main job: pack a model, load it three ways, verify every tensor, compute on it.
    Demo(demo::DemoArgs),
    /// Write the synthetic demo model (model.safetensors + config.json) into DIR.
    Synth(synth::SynthArgs),
    /// Run a program with the preload library (libckalloc_preload.so) in LD_PRELOAD; exits
    /// with the program's status.
    Run(run_cmd::RunArgs),
}

fn run(cli: Cli) -> Result<(), CliError> {
    let g = cli.global;
    match cli.command {
        Command::Probe(a) => probe::run(g, a),
        Command::Pack(a) => pack::run(g, a),
        Command::Inspect(a) => inspect::run(g, a),
        Command::Load(a) => load::run(g, a),
        Command::Demo(a) => demo::run(g, a),
        Command::Synth(a) => synth::run(g, a),
        // Handled in `main`: it becomes the program.
        Command::Run(_) => Ok(()),
    }
}

fn main() -> ExitCode {
    error::install_panic_hook();
    // `--json` is global; look for it before parsing so usage errors can be JSON too.
    let json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    sigbus::set_json(json);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return error::usage_error(e, json),
    };
    if let Command::Run(a) = cli.command {
        if cli.global.json {
            crate::errln!(
                "ckalloc: error: --json does not apply to run (the program's output is its own)"
            );
            return ExitCode::from(2);
        }
        return run_cmd::run(a);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(json),
    }
}
