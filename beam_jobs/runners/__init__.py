"""Where the job runs: checks of runner flags before anything runs, what remote workers install, and fixes of
Beam's DirectRunner and DaskRunner (each module says which upstream bug it works around)."""
