//! Segment round trips, recall against flat search, and damaged files.

mod codebook;
mod compat;
mod corruption;
mod data;
mod filters;
mod recall;
mod round_trips;
mod roundtrip;
