pub mod db;
pub mod dev;
pub mod operator;
pub mod webapp;
