from trainyard_admission.main import run

run()
