//! One module per subcommand: its clap arguments and its `run`.

pub mod demo;
pub mod inspect;
pub mod load;
pub mod pack;
pub mod probe;
pub mod run;
pub mod synth;
