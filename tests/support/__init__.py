"""Helpers the tests share that are neither fakes nor fixtures: the images they build."""
