from trainyard_placement.main import run

run()
