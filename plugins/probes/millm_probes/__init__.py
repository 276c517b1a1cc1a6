"""millm probe monitors: trained linear readouts, checked and read on live traffic."""
