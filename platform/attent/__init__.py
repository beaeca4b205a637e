"""AtteNT experiment platform."""
