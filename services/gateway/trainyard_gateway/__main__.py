from trainyard_gateway.main import run

run()
