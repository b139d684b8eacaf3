# Stacked bars: per schedule and stage, the share of the step spent in each kind of
# work, from `pipetrain timeline --breakdown --json` (experiment_data.py breakdown).
#   gnuplot -e "data='breakdown.dat'; out='breakdown.png'; title_text='...'" breakdown.gp
if (!exists("title_text")) title_text = "Where each stage's time goes"
set terminal pngcairo size 1100,480 font "DejaVu Sans,10"
set output out
set termoption noenhanced
set title title_text
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border lc rgb "white"
set boxwidth 0.8
set ylabel "% of the step"
set yrange [0:100]
set xtics rotate by -45 scale 0
set key outside right top box opaque
set grid ytics lc rgb "#eeeeee"
names = "forward backward backward-input backward-weight recompute optimizer send recv-wait idle"
colours = "#4C72B0 #DD8452 #C44E52 #8172B3 #937860 #222222 #55A868 #CCCCCC #F2F2F2"
plot for [i = 2:10] data using i:xtic(1) lc rgb word(colours, i - 1) title word(names, i - 1)
