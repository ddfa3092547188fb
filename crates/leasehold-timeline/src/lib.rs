#![doc = include_str!("../README.md")]

pub mod draw;
mod history;

pub use history::history_svg;
