"""Helpers shared by the entry points: command line, config, IO, resolvers, validation."""
