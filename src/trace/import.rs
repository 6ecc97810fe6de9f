//! Importers for public trace formats.
