"""The demo platform behind ``scripts/run``: a seeder and a process orchestrator."""
