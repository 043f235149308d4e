"""The SMART tier: pySMART against the stand-in smartctl in fixtures/smartctl."""
