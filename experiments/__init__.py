"""The experiment catalog as code."""
