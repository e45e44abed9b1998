"""Tests of the policy pack (policy/)."""
