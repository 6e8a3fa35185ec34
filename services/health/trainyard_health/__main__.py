from trainyard_health.main import run

run()
