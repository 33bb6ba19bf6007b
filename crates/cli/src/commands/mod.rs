pub mod dev;
