from trainyard_accounting.main import run

run()
